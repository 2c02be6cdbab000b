# GRADSYNC_PYTHON=AUTO builds the Python package (python/) when Python 3 with its headers and
# pybind11 are found; ON requires them; OFF never looks. The interpreter is Debian's
# /usr/bin/python3 when it exists (python3-torch installs there; a python3 earlier on the PATH,
# such as a pyenv one, has no torch), unless Python3_EXECUTABLE is given. GRADSYNC_PYTHON_EXECUTABLE
# (gradsync/config.h) is that interpreter: gradsync-launch runs a worker command "python3" or
# "python" with it, so that a script meets the interpreter the package was built for ("" without
# the package: the command runs as given). Every static library is then built
# position-independent, so that the module can link them.
set(GRADSYNC_HAVE_PYTHON 0)
set(GRADSYNC_PYTHON_EXECUTABLE "")
string(TOUPPER "${GRADSYNC_PYTHON}" _gs_python)
if(_gs_python STREQUAL "OFF")
  message(STATUS "gradsync: Python package off (GRADSYNC_PYTHON=OFF)")
elseif(_gs_python STREQUAL "AUTO" OR _gs_python STREQUAL "ON")
  if(NOT Python3_EXECUTABLE AND EXISTS /usr/bin/python3)
    set(Python3_EXECUTABLE /usr/bin/python3)
  endif()
  find_package(Python3 COMPONENTS Interpreter Development.Module)
  if(Python3_FOUND)
    set(PYBIND11_FINDPYTHON ON)
    find_package(pybind11 CONFIG QUIET)
  endif()
  if(Python3_FOUND AND pybind11_FOUND)
    set(GRADSYNC_HAVE_PYTHON 1)
    set(GRADSYNC_PYTHON_EXECUTABLE ${Python3_EXECUTABLE})
    set(CMAKE_POSITION_INDEPENDENT_CODE ON)
    set(GRADSYNC_PYTHON_INSTALL_DIR "lib/python${Python3_VERSION_MAJOR}.${Python3_VERSION_MINOR}/dist-packages"
        CACHE STRING "Where cmake --install puts the gradsync package (relative to the prefix)")
    message(STATUS "gradsync: Python package on (${Python3_EXECUTABLE}, pybind11 ${pybind11_VERSION})")
  elseif(_gs_python STREQUAL "ON")
    message(FATAL_ERROR "GRADSYNC_PYTHON=ON: Python 3 headers (python3-dev) or pybind11 (python3-pybind11) not found")
  else()
    message(STATUS "gradsync: Python package off (python3-dev or python3-pybind11 not found)")
  endif()
else()
  message(FATAL_ERROR "GRADSYNC_PYTHON must be AUTO, ON or OFF, not '${GRADSYNC_PYTHON}'")
endif()
