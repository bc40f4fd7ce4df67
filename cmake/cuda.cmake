# The CUDA engine (csrc/cuda) and its place in the extension. Included at the
# end of the top-level CMakeLists.txt, after the _C target exists:
#
#   include(cmake/cuda.cmake)
#
# Options:
#   FUSEDATTN_CUDA=AUTO|ON|OFF   AUTO (default): build the CUDA engine into the
#       extension when nvcc is found (torch need not have CUDA: the binary is
#       the same for every torch, see CMakeLists.txt); ON: the same, but fail
#       without nvcc; OFF: the CPU engine only.
#   FUSEDATTN_CUDA_COMPILE_ONLY=ON   compile the torch-free kernels
#       (target fusedattn_cuda_kernels) with nvcc alone, also without the
#       extension.
#   FUSEDATTN_CUDA_WERROR=ON   fail the CUDA compile on any warning (CI's builds;
#       on with FUSEDATTN_CUDA_COMPILE_ONLY).
#   FUSEDATTN_CUDA_TC=ON|OFF   whether the tensor-core kernels (csrc/cuda/tc) are
#       built; OFF: the dispatch (FUSEDATTN_HAS_TC=0) never asks them.
#   FUSEDATTN_CUDA_JOBS=N   at most N nvcc processes at once under Ninja
#       (default: one per 3 GiB of memory, at most one per core).
# Architectures: CMAKE_CUDA_ARCHITECTURES when given (-D...), else
# TORCH_CUDA_ARCH_LIST (CMake variable or environment, torch's syntax: "8.0;9.0",
# "9.0+PTX"), else "80;90" (sm_80 and sm_90 machine code, PTX for newer GPUs).
# The CUDA runtime is linked statically: the library does not depend on the
# libcudart that torch ships.

set(FUSEDATTN_CUDA "AUTO" CACHE STRING "Build the CUDA engine: AUTO, ON or OFF")
set_property(CACHE FUSEDATTN_CUDA PROPERTY STRINGS AUTO ON OFF)
option(FUSEDATTN_CUDA_COMPILE_ONLY "Compile the torch-free CUDA kernels (fusedattn_cuda_kernels) without linking them" OFF)
option(FUSEDATTN_CUDA_WERROR "Fail the CUDA compile on any warning" ${FUSEDATTN_CUDA_COMPILE_ONLY})
option(FUSEDATTN_CUDA_TC "Build the tensor-core kernels (csrc/cuda/tc); OFF: the SIMT engine runs every call" ON)
set(FUSEDATTN_CUDA_JOBS "" CACHE STRING "Most nvcc processes at once (Ninja); empty: from cores and memory")

# ---- should the engine be built? ------------------------------------------------
set(_fa_cuda_reason "")
set(_fa_want_cuda FALSE)
if(NOT FUSEDATTN_BUILD_EXTENSION AND NOT FUSEDATTN_CUDA_COMPILE_ONLY)
  set(_fa_cuda_reason "the extension is not built")
elseif(FUSEDATTN_CUDA STREQUAL "OFF" AND NOT FUSEDATTN_CUDA_COMPILE_ONLY)
  set(_fa_cuda_reason "FUSEDATTN_CUDA=OFF")
else()
  if(NOT CMAKE_CUDA_COMPILER)
    include(CheckLanguage)
    check_language(CUDA)
  endif()
  if(CMAKE_CUDA_COMPILER)
    set(_fa_want_cuda TRUE)
  else()
    set(_fa_cuda_reason "nvcc was not found (put it on PATH or set CUDACXX)")
  endif()
endif()
if(FUSEDATTN_CUDA STREQUAL "ON" AND NOT _fa_want_cuda)
  message(FATAL_ERROR "fusedattn: FUSEDATTN_CUDA=ON but the CUDA engine cannot be built: ${_fa_cuda_reason}")
endif()

if(_fa_want_cuda)
  # ---- architectures ------------------------------------------------------------
  # A CMAKE_CUDA_ARCHITECTURES given on the command line wins. It is told from
  # the value CMake itself caches when CUDA is enabled without one (the
  # compiler's default, e.g. 75) by its help string, hence the cache reads.
  set(_fa_user_archs "")
  if(DEFINED CACHE{CMAKE_CUDA_ARCHITECTURES})
    get_property(_fa_help CACHE CMAKE_CUDA_ARCHITECTURES PROPERTY HELPSTRING)
    if(_fa_help MATCHES "command line" AND NOT "$CACHE{CMAKE_CUDA_ARCHITECTURES}" MATCHES "^(OFF|)$")
      set(_fa_user_archs "$CACHE{CMAKE_CUDA_ARCHITECTURES}")
    endif()
  endif()
  if(NOT _fa_user_archs STREQUAL "")
    set(FUSEDATTN_CUDA_ARCHS "${_fa_user_archs}")
  else()
    set(_fa_torch_list "")
    if(DEFINED TORCH_CUDA_ARCH_LIST AND NOT TORCH_CUDA_ARCH_LIST STREQUAL "")
      set(_fa_torch_list "${TORCH_CUDA_ARCH_LIST}")
    elseif(DEFINED ENV{TORCH_CUDA_ARCH_LIST} AND NOT "$ENV{TORCH_CUDA_ARCH_LIST}" STREQUAL "")
      set(_fa_torch_list "$ENV{TORCH_CUDA_ARCH_LIST}")
    endif()
    set(FUSEDATTN_CUDA_ARCHS "")
    if(_fa_torch_list STREQUAL "")
      set(FUSEDATTN_CUDA_ARCHS 80 90)
    else()
      string(REPLACE " " ";" _fa_torch_list "${_fa_torch_list}")
      foreach(_fa_a IN LISTS _fa_torch_list)
        if(_fa_a MATCHES "^([0-9]+)\\.([0-9]+)([a-z]?)(\\+PTX)?$")
          set(_fa_num "${CMAKE_MATCH_1}${CMAKE_MATCH_2}${CMAKE_MATCH_3}")
          if(CMAKE_MATCH_4)
            list(APPEND FUSEDATTN_CUDA_ARCHS "${_fa_num}")  # machine code and PTX
          else()
            list(APPEND FUSEDATTN_CUDA_ARCHS "${_fa_num}-real")
          endif()
        elseif(NOT _fa_a STREQUAL "")
          message(WARNING "fusedattn: ignoring TORCH_CUDA_ARCH_LIST entry '${_fa_a}' (use numbers such as 9.0)")
        endif()
      endforeach()
      if(FUSEDATTN_CUDA_ARCHS STREQUAL "")
        set(FUSEDATTN_CUDA_ARCHS 80 90)
      endif()
    endif()
  endif()

  if(NOT CMAKE_CUDA_COMPILER_LOADED)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES ${FUSEDATTN_CUDA_ARCHS})
    endif()
    enable_language(CUDA)
  endif()
  # ---- the kernels: object files, torch-free --------------------------------------
  file(GLOB_RECURSE FUSEDATTN_CUDA_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/csrc/cuda/*.cu)
  if(NOT FUSEDATTN_CUDA_TC)
    list(FILTER FUSEDATTN_CUDA_SOURCES EXCLUDE REGEX "/csrc/cuda/tc/")
  endif()
  # The Hopper path (wgmma, setmaxnreg) assembles for sm_90a only: its own
  # object library below, never compiled for the other architectures.
  list(FILTER FUSEDATTN_CUDA_SOURCES EXCLUDE REGEX "/csrc/cuda/hopper/")
  add_library(fusedattn_cuda_objects OBJECT ${FUSEDATTN_CUDA_SOURCES})
  target_include_directories(fusedattn_cuda_objects
    PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}/csrc/cuda/include ${CMAKE_CURRENT_SOURCE_DIR}/csrc/core/include
    PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/csrc/cuda)
  set_target_properties(fusedattn_cuda_objects PROPERTIES
    CUDA_ARCHITECTURES "${FUSEDATTN_CUDA_ARCHS}"
    CUDA_STANDARD 17
    CUDA_STANDARD_REQUIRED ON
    POSITION_INDEPENDENT_CODE ON)
  target_compile_options(fusedattn_cuda_objects PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra>)
  if(FUSEDATTN_CUDA_WERROR)
    # CI's builds fail on any warning; a user's build never does.
    target_compile_options(fusedattn_cuda_objects PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings -Xcompiler=-Werror>)
  endif()
  # Hopper forward path: built when the architectures include 9.0 (as 90 or
  # 90a) and the tensor-core engine is on; compiled for sm_90a alone. At run
  # time it takes calls only on a 9.0 device that can load that code.
  set(_fa_hopper OFF)
  if(FUSEDATTN_CUDA_TC AND "${FUSEDATTN_CUDA_ARCHS}" MATCHES "(^|;)90"
     AND CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.3)
    set(_fa_hopper ON)
  endif()
  set(_fa_kernel_objects $<TARGET_OBJECTS:fusedattn_cuda_objects>)
  if(_fa_hopper)
    # The hand-written sources and one generated file per line of hopper/kernels.list.
    file(GLOB FUSEDATTN_HOPPER_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/csrc/cuda/hopper/*.cu
         ${CMAKE_CURRENT_SOURCE_DIR}/csrc/cuda/hopper/generated/*.cu)
    add_library(fusedattn_cuda_hopper OBJECT ${FUSEDATTN_HOPPER_SOURCES})
    target_include_directories(fusedattn_cuda_hopper
      PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}/csrc/cuda/include ${CMAKE_CURRENT_SOURCE_DIR}/csrc/core/include
      PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/csrc/cuda)
    set_target_properties(fusedattn_cuda_hopper PROPERTIES
      CUDA_ARCHITECTURES 90a-real
      CUDA_STANDARD 17
      CUDA_STANDARD_REQUIRED ON
      POSITION_INDEPENDENT_CODE ON
      JOB_POOL_COMPILE fusedattn_nvcc)
    target_compile_options(fusedattn_cuda_hopper PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra>)
    if(FUSEDATTN_CUDA_WERROR)
      target_compile_options(fusedattn_cuda_hopper PRIVATE
        $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings -Xcompiler=-Werror>)
    endif()
    list(APPEND _fa_kernel_objects $<TARGET_OBJECTS:fusedattn_cuda_hopper>)
  endif()
  message(STATUS "fusedattn: Hopper (sm_90a) forward path: ${_fa_hopper}")
  # Which optional engines the dispatch (csrc/cuda/dispatch) may ask.
  if(FUSEDATTN_CUDA_TC)
    set(_fa_has_tc 1)
  else()
    set(_fa_has_tc 0)
  endif()
  if(_fa_hopper)
    set(_fa_has_hopper 1)
  else()
    set(_fa_has_hopper 0)
  endif()
  target_compile_definitions(fusedattn_cuda_objects PRIVATE
    FUSEDATTN_HAS_TC=${_fa_has_tc} FUSEDATTN_HAS_HOPPER=${_fa_has_hopper})

  add_library(fusedattn_cuda_kernels STATIC ${_fa_kernel_objects})
  set_target_properties(fusedattn_cuda_kernels PROPERTIES LINKER_LANGUAGE CXX)

  # Bound parallel nvcc processes (each can take a few GiB).
  if(FUSEDATTN_CUDA_JOBS STREQUAL "")
    cmake_host_system_information(RESULT _fa_cores QUERY NUMBER_OF_LOGICAL_CORES)
    cmake_host_system_information(RESULT _fa_mem QUERY TOTAL_PHYSICAL_MEMORY)
    math(EXPR _fa_jobs "${_fa_mem} / 3072")
    if(_fa_jobs GREATER _fa_cores)
      set(_fa_jobs ${_fa_cores})
    endif()
    if(_fa_jobs LESS 1)
      set(_fa_jobs 1)
    endif()
  else()
    set(_fa_jobs ${FUSEDATTN_CUDA_JOBS})
  endif()
  set_property(GLOBAL APPEND PROPERTY JOB_POOLS fusedattn_nvcc=${_fa_jobs})
  set_target_properties(fusedattn_cuda_objects PROPERTIES JOB_POOL_COMPILE fusedattn_nvcc)

  message(STATUS "fusedattn: CUDA kernels for architectures ${FUSEDATTN_CUDA_ARCHS} (${_fa_jobs} nvcc jobs)")
endif()

# ---- the extension's CUDA operators ------------------------------------------------
if(_fa_want_cuda AND TARGET _C AND NOT FUSEDATTN_CUDA STREQUAL "OFF")
  find_package(CUDAToolkit REQUIRED)
  target_link_libraries(_C PRIVATE fusedattn_cuda_objects CUDA::cudart_static)
  # _C was created before CUDA was enabled, so it has no architectures of its own; linking the kernel
  # objects makes it a CUDA target, which CMake requires to name them.
  set_target_properties(_C PROPERTIES CUDA_ARCHITECTURES "${FUSEDATTN_CUDA_ARCHS}")
  if(TARGET fusedattn_cuda_hopper)
    target_link_libraries(_C PRIVATE fusedattn_cuda_hopper)
  endif()
  target_compile_definitions(_C PRIVATE FUSEDATTN_WITH_CUDA=1)
  message(STATUS "fusedattn: CUDA engine: on (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, CUDA runtime linked statically)")
else()
  if(_fa_cuda_reason STREQUAL "")
    set(_fa_cuda_reason "the extension is not built")
  endif()
  message(STATUS "fusedattn: CUDA engine: off (${_fa_cuda_reason})")
endif()
