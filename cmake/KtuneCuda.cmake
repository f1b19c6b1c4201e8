# The CUDA backend's build settings, included by the top-level CMakeLists before any layer.
#   KTUNE_CUDA = AUTO (default): ON where check_language(CUDA) finds nvcc, OFF otherwise.
#                ON: required (configure fails without nvcc).  OFF: no CUDA anywhere in the build.
#   KTUNE_CPU_ENGINE = ON (default): the whole project. OFF: only src/core, src/kernels/cuda and
#                tests/kernels/cuda, so that a bare GPU machine without Debian's -dev packages
#                (no oneDNN, no GoogleTest, ...) builds and runs the CUDA tests (scripts/gpu-check.sh).
# After this file KTUNE_CUDA holds the resolved ON/OFF (a normal variable shadowing the cache
# entry), which is what src/dist (NCCL) and the CUDA CMakeLists test.
# It deliberately compiles for one GPU generation only (sm_90 SASS plus compute_90 PTX, which the
# driver JIT-compiles for newer GPUs): every extra architecture multiplies the CUDA build time.
set(KTUNE_CUDA AUTO CACHE STRING "Build the CUDA backend: AUTO (when nvcc is found), ON or OFF")
set_property(CACHE KTUNE_CUDA PROPERTY STRINGS AUTO ON OFF)
option(KTUNE_CPU_ENGINE "Build the CPU engine and every layer (OFF: core and the CUDA kernels only)" ON)

string(TOUPPER "${KTUNE_CUDA}" _ktune_cuda_request)
if(_ktune_cuda_request STREQUAL "AUTO" AND KTUNE_SANITIZE)
  # The sanitizer flags do not survive nvcc's -Xcompiler (it splits them at commas), and the
  # sanitizer build is a CPU check: AUTO means OFF there (KTUNE_CUDA=ON still forces it).
  message(STATUS "ktune: KTUNE_SANITIZE=ON: KTUNE_CUDA=AUTO resolves to OFF")
  set(_ktune_cuda_request OFF)
endif()
if(_ktune_cuda_request STREQUAL "AUTO" OR _ktune_cuda_request STREQUAL "ON")
  if(NOT CMAKE_CUDA_COMPILER)
    # nvcc is often installed outside PATH; look where the toolkit installs it.
    find_program(_ktune_nvcc nvcc HINTS /usr/local/cuda/bin)
    if(_ktune_nvcc AND NOT DEFINED ENV{CUDACXX})
      set(ENV{CUDACXX} "${_ktune_nvcc}")
    endif()
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(KTUNE_CUDA ON)
  elseif(_ktune_cuda_request STREQUAL "ON")
    message(FATAL_ERROR "ktune: KTUNE_CUDA=ON but no CUDA compiler (nvcc) was found; set CUDACXX or PATH")
  else()
    set(KTUNE_CUDA OFF)
  endif()
else()
  set(KTUNE_CUDA OFF)
endif()

if(NOT KTUNE_CPU_ENGINE AND NOT KTUNE_CUDA)
  message(FATAL_ERROR "ktune: KTUNE_CPU_ENGINE=OFF builds only the CUDA backend, but CUDA is off or not found")
endif()

if(KTUNE_CUDA)
  if(NOT CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES "90-real;90-virtual")
  endif()
  if(KTUNE_CCACHE)
    set(CMAKE_CUDA_COMPILER_LAUNCHER ${KTUNE_CCACHE})
  endif()
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  set(CMAKE_CUDA_STANDARD 17)  # CMake 3.25 knows no CUDA20 flags for nvcc; core headers are C++17-clean
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  set(CMAKE_CUDA_EXTENSIONS OFF)
  message(STATUS "ktune: CUDA backend ON (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, architectures ${CMAKE_CUDA_ARCHITECTURES})")
else()
  message(STATUS "ktune: CUDA backend OFF")
endif()

# The top-level add_compile_options (-Wall, -march=native, sanitizers) are host-compiler flags that
# nvcc rejects: in the calling directory, keep them for C/C++ and hand them to nvcc's host compiler.
function(ktune_cuda_wrap_directory_options)
  get_directory_property(_opts COMPILE_OPTIONS)
  set(_wrapped)
  foreach(o IN LISTS _opts)
    if(o MATCHES "^\\$<")  # already language-guarded
      list(APPEND _wrapped "${o}")
    elseif(o MATCHES ",")
      # nvcc splits -Xcompiler values at commas (-fsanitize=address,undefined): C/C++ only, so
      # the host code of .cu files is not instrumented in a sanitizer build with CUDA forced on.
      list(APPEND _wrapped "$<$<COMPILE_LANGUAGE:C,CXX>:${o}>")
    else()
      list(APPEND _wrapped "$<$<COMPILE_LANGUAGE:C,CXX>:${o}>" "$<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=${o}>")
    endif()
  endforeach()
  set_directory_properties(PROPERTIES COMPILE_OPTIONS "${_wrapped}")
endfunction()
