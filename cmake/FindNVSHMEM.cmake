# Finds NVSHMEM: NVSHMEM_HOME (CMake or environment variable), else the pip wheel
# nvidia-nvshmem-cu13 (or -cu12) of the Python found on PATH, else /usr/local/nvshmem. Needs
# include/nvshmem.h, lib/libnvshmem_host.so.3 (the wheel has no unversioned link) and
# lib/libnvshmem_device.a. Defines NVSHMEM_FOUND, NVSHMEM_HOME, NVSHMEM_VERSION and the imported
# targets NVSHMEM::host (shared) and NVSHMEM::device (static, device code: needs -rdc).
set(_nvshmem_hints "")
if(NVSHMEM_HOME)
  list(APPEND _nvshmem_hints "${NVSHMEM_HOME}")
elseif(DEFINED ENV{NVSHMEM_HOME})
  list(APPEND _nvshmem_hints "$ENV{NVSHMEM_HOME}")
else()
  find_program(_nvshmem_python NAMES python3 python)
  if(_nvshmem_python)
    execute_process(
      COMMAND "${_nvshmem_python}" -c "import nvidia.nvshmem, os; print(os.path.dirname(nvidia.nvshmem.__file__) if nvidia.nvshmem.__file__ else list(nvidia.nvshmem.__path__)[0])"
      OUTPUT_VARIABLE _nvshmem_wheel OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _nvshmem_status)
    if(_nvshmem_status EQUAL 0 AND _nvshmem_wheel)
      list(APPEND _nvshmem_hints "${_nvshmem_wheel}")
    endif()
  endif()
  list(APPEND _nvshmem_hints /usr/local/nvshmem /opt/nvshmem)
endif()

find_path(NVSHMEM_INCLUDE_DIR nvshmem.h PATHS ${_nvshmem_hints} PATH_SUFFIXES include NO_DEFAULT_PATH)
find_file(NVSHMEM_HOST_LIBRARY NAMES libnvshmem_host.so.3 libnvshmem_host.so PATHS ${_nvshmem_hints}
          PATH_SUFFIXES lib lib64 NO_DEFAULT_PATH)
find_file(NVSHMEM_DEVICE_LIBRARY NAMES libnvshmem_device.a PATHS ${_nvshmem_hints} PATH_SUFFIXES lib lib64
          NO_DEFAULT_PATH)

if(NVSHMEM_INCLUDE_DIR AND EXISTS "${NVSHMEM_INCLUDE_DIR}/non_abi/nvshmem_version.h")
  file(STRINGS "${NVSHMEM_INCLUDE_DIR}/non_abi/nvshmem_version.h" _nvshmem_version_lines
       REGEX "#define NVSHMEM_VENDOR_(MAJOR|MINOR|PATCH)_VERSION")
  foreach(_part MAJOR MINOR PATCH)
    string(REGEX REPLACE ".*NVSHMEM_VENDOR_${_part}_VERSION ([0-9]+).*" "\\1" _nvshmem_${_part}
           "${_nvshmem_version_lines}")
  endforeach()
  set(NVSHMEM_VERSION "${_nvshmem_MAJOR}.${_nvshmem_MINOR}.${_nvshmem_PATCH}")
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NVSHMEM REQUIRED_VARS NVSHMEM_INCLUDE_DIR NVSHMEM_HOST_LIBRARY NVSHMEM_DEVICE_LIBRARY
                                  VERSION_VAR NVSHMEM_VERSION)

if(NVSHMEM_FOUND)
  get_filename_component(NVSHMEM_HOME "${NVSHMEM_INCLUDE_DIR}" DIRECTORY)
  get_filename_component(NVSHMEM_LIBRARY_DIR "${NVSHMEM_HOST_LIBRARY}" DIRECTORY)
  if(NOT TARGET NVSHMEM::host)
    add_library(NVSHMEM::host SHARED IMPORTED)
    set_target_properties(NVSHMEM::host PROPERTIES IMPORTED_LOCATION "${NVSHMEM_HOST_LIBRARY}"
                          IMPORTED_NO_SONAME OFF INTERFACE_INCLUDE_DIRECTORIES "${NVSHMEM_INCLUDE_DIR}")
    add_library(NVSHMEM::device STATIC IMPORTED)
    set_target_properties(NVSHMEM::device PROPERTIES IMPORTED_LOCATION "${NVSHMEM_DEVICE_LIBRARY}"
                          INTERFACE_INCLUDE_DIRECTORIES "${NVSHMEM_INCLUDE_DIR}")
  endif()
endif()
mark_as_advanced(NVSHMEM_INCLUDE_DIR NVSHMEM_HOST_LIBRARY NVSHMEM_DEVICE_LIBRARY)
