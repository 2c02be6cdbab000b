# Every dependency comes from Debian (scripts/setup.sh installs them).
find_package(Threads REQUIRED)
find_package(Boost 1.74 REQUIRED COMPONENTS program_options)
find_package(ZLIB REQUIRED)
find_package(Protobuf REQUIRED)
find_package(cppzmq REQUIRED)  # brings libzmq as the imported target libzmq

# OpenBLAS is linked explicitly: Debian's default libblas is the slow reference implementation.
find_package(PkgConfig REQUIRED)
pkg_check_modules(OPENBLAS REQUIRED IMPORTED_TARGET openblas)
add_library(gradsync_openblas INTERFACE)
target_link_libraries(gradsync_openblas INTERFACE PkgConfig::OPENBLAS)

# libsodium (the ring's handshake MACs and AEAD frames, the servers' replication key compare);
# libzmq links it too, for CURVE.
pkg_check_modules(SODIUM REQUIRED IMPORTED_TARGET libsodium)
add_library(gradsync_sodium INTERFACE)
target_link_libraries(gradsync_sodium INTERFACE PkgConfig::SODIUM)

if(GRADSYNC_BUILD_TESTS)
  find_package(GTest REQUIRED)
  include(GoogleTest)
endif()
