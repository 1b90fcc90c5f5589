# cmake/cuda.cmake — the CUDA backend (src/backend/cuda/*.cu): built when nvcc is found;
# -DINFERD_CUDA=ON requires it, -DINFERD_CUDA=OFF skips it. Without it,
# src/backend/cuda/cuda_stub.c answers that CUDA is absent.
set(INFERD_CUDA "AUTO" CACHE STRING "Build the CUDA backend: AUTO (when nvcc is found), ON or OFF")
# sm_90a (Hopper, its warp-group instructions) machine code, plus compute_80 PTX that the driver compiles for any newer GPU.
set(INFERD_CUDA_ARCHITECTURES "90a-real;80-virtual" CACHE STRING "CUDA_ARCHITECTURES of the CUDA backend")

if(INFERD_FUZZ)
  # libFuzzer builds instrument host code only; nvcc would get clang's flags.
  set(INFERD_CUDA "OFF")
endif()

if(NOT INFERD_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES ${INFERD_CUDA_ARCHITECTURES})
    endif()
    enable_language(CUDA)
    # Targets made before CUDA was enabled (the library, the CLI, the tests)
    # link CUDA code too, and CMake wants their architectures named.
    get_property(inferd_targets DIRECTORY ${CMAKE_SOURCE_DIR} PROPERTY BUILDSYSTEM_TARGETS)
    foreach(t ${inferd_targets})
      set_property(TARGET ${t} PROPERTY CUDA_ARCHITECTURES ${CMAKE_CUDA_ARCHITECTURES})
    endforeach()
    find_package(CUDAToolkit REQUIRED)
    file(GLOB INFERD_CUDA_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/backend/cuda/*.cu)
    add_library(inferd_cuda STATIC ${INFERD_CUDA_SOURCES})
    set_target_properties(inferd_cuda PROPERTIES
      CUDA_ARCHITECTURES "${INFERD_CUDA_ARCHITECTURES}"
      CUDA_STANDARD 17
      CUDA_STANDARD_REQUIRED ON)
    target_include_directories(inferd_cuda PRIVATE ${CMAKE_SOURCE_DIR}/src)
    target_compile_options(inferd_cuda PRIVATE -lineinfo -Xcompiler=-Wall,-Wno-unused-parameter,-Wno-sign-compare)
    # the kernels call back into the library (errors, logging): a cycle of static libraries
    target_link_libraries(inferd_cuda PUBLIC CUDA::cudart_static CUDA::cublasLt inferd_lib)
    target_link_libraries(inferd_lib PUBLIC inferd_cuda)
    target_compile_definitions(inferd_lib PUBLIC INFERD_HAVE_CUDA)
    # GPU benchmarks (not tests): bench/*.cu, one program each, over the backend's kernels.
    file(GLOB INFERD_CUDA_BENCH_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/bench/*.cu)
    foreach(src ${INFERD_CUDA_BENCH_SOURCES})
      get_filename_component(name ${src} NAME_WE)
      add_executable(${name} ${src})
      set_target_properties(${name} PROPERTIES CUDA_ARCHITECTURES "${INFERD_CUDA_ARCHITECTURES}"
        CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON)
      target_include_directories(${name} PRIVATE ${CMAKE_SOURCE_DIR}/src)
      target_link_libraries(${name} PRIVATE inferd_cuda)
    endforeach()
    message(STATUS "inferd: CUDA backend on (${CMAKE_CUDA_COMPILER}, architectures ${INFERD_CUDA_ARCHITECTURES})")
  elseif(INFERD_CUDA STREQUAL "ON")
    message(FATAL_ERROR "INFERD_CUDA=ON but no CUDA compiler (nvcc) was found")
  else()
    message(STATUS "inferd: no CUDA compiler found; the CUDA backend is skipped")
  endif()
else()
  message(STATUS "inferd: CUDA backend off (INFERD_CUDA=OFF)")
endif()
