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

if(GRADSYNC_BUILD_TESTS)
  find_package(GTest REQUIRED)
  include(GoogleTest)
endif()

# Optional: the Python interpreter. gradsync-launch runs a worker command "python3" or "python"
# with it, so that a script meets the interpreter the gradsync Python package was built for;
# without one the command runs as given. The interpreter's own path (sys.executable), so that a
# wrapper on the PATH (a pyenv shim) does not come between.
set(GRADSYNC_PYTHON_EXECUTABLE "")
find_package(Python3 COMPONENTS Interpreter QUIET)
if(Python3_Interpreter_FOUND)
  execute_process(COMMAND "${Python3_EXECUTABLE}" -c "import sys; print(sys.executable)"
                  OUTPUT_VARIABLE GRADSYNC_PYTHON_EXECUTABLE OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(NOT GRADSYNC_PYTHON_EXECUTABLE)
    set(GRADSYNC_PYTHON_EXECUTABLE "${Python3_EXECUTABLE}")
  endif()
  message(STATUS "gradsync: Python ${GRADSYNC_PYTHON_EXECUTABLE}")
endif()
