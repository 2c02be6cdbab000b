# Target helpers in the style of absl_cc_library: explicit sources, one alias per library.

# Warnings ride an INTERFACE target so every gradsync target gets the same set.
add_library(gradsync_warnings INTERFACE)
target_compile_options(gradsync_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor
  -Wold-style-cast -Wcast-align -Woverloaded-virtual -Wimplicit-fallthrough>)
# GCC 12 at -O3 reports false -Wrestrict warnings inside std::string's operator+ (GCC PR 105329).
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
  target_compile_options(gradsync_warnings INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Wno-restrict>)
endif()
if(GRADSYNC_WERROR)
  target_compile_options(gradsync_warnings INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
endif()
include(CheckCXXCompilerFlag)
check_cxx_compiler_flag(-Wthread-safety GRADSYNC_HAS_WTHREAD_SAFETY)
if(GRADSYNC_HAS_WTHREAD_SAFETY)
  target_compile_options(gradsync_warnings INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Wthread-safety>)
endif()
if(GRADSYNC_SANITIZE)
  target_compile_options(gradsync_warnings INTERFACE -fsanitize=${GRADSYNC_SANITIZE} -fno-omit-frame-pointer)
  target_link_options(gradsync_warnings INTERFACE -fsanitize=${GRADSYNC_SANITIZE})
endif()

# gradsync_cc_library(NAME common SRCS a.cc b.cc DEPS x y [PUBLIC_DEPS ...])
function(gradsync_cc_library)
  cmake_parse_arguments(ARG "" "NAME" "SRCS;DEPS;PRIVATE_DEPS" ${ARGN})
  set(target gradsync_${ARG_NAME})
  add_library(${target} STATIC ${ARG_SRCS})
  add_library(gradsync::${ARG_NAME} ALIAS ${target})
  target_include_directories(${target} PUBLIC ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR})
  target_link_libraries(${target} PUBLIC ${ARG_DEPS} PRIVATE gradsync_warnings ${ARG_PRIVATE_DEPS})
endfunction()

# gradsync_cc_binary(NAME gradsync-worker SRCS main.cc DEPS ...)
function(gradsync_cc_binary)
  cmake_parse_arguments(ARG "" "NAME" "SRCS;DEPS" ${ARGN})
  add_executable(${ARG_NAME} ${ARG_SRCS})
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_DEPS} gradsync_warnings)
endfunction()

# gradsync_cc_test(NAME common_test SRCS ... DEPS ... LABELS unit [TIMEOUT s] [SERIAL])
# SERIAL: ctest runs its cases alone (timings compared).
# One gtest binary per module; gtest_discover_tests registers each TEST as its own CTest case.
# The target gradsync_unit_tests builds the binaries labelled unit (scripts/sanitize.sh).
add_custom_target(gradsync_unit_tests)
function(gradsync_cc_test)
  cmake_parse_arguments(ARG "SERIAL" "NAME;TIMEOUT" "SRCS;DEPS;LABELS" ${ARGN})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 120)
  endif()
  set(serial FALSE)
  if(ARG_SERIAL)
    set(serial TRUE)
  endif()
  add_executable(${ARG_NAME} ${ARG_SRCS})
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_DEPS} GTest::gtest GTest::gtest_main gradsync_warnings)
  set_target_properties(${ARG_NAME} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  gtest_discover_tests(${ARG_NAME}
    PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT} RUN_SERIAL ${serial}
    ENVIRONMENT "GRADSYNC_BIN_DIR=${CMAKE_BINARY_DIR}/bin"
    DISCOVERY_TIMEOUT 60
    # Test names without "# GetParam() = <88-byte object ...>": ctest pads every line to the longest.
    NO_PRETTY_TYPES NO_PRETTY_VALUES)
  if("unit" IN_LIST ARG_LABELS)
    add_dependencies(gradsync_unit_tests ${ARG_NAME})
  endif()
endfunction()
