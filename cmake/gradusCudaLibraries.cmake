# The libraries gradus::cuda links beside the code nvcc compiles: the CUDA toolkit's
# (CUDA::cudart, CUDA::cublas: find_package(CUDAToolkit)) and cuDNN, wrapped as the imported
# target gradus_cudnn. Used by the build tree (gradusCuda.cmake, once nvcc is found) and by the
# installed package (gradusConfig.cmake, component cuda), so that a consumer finds them on its
# own machine rather than where gradus was built. Quiet: each caller says what is missing.
if(NOT TARGET gradus_cudnn)
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    find_library(GRADUS_CUDNN_LIBRARY cudnn HINTS ${CUDAToolkit_LIBRARY_DIR})
    if(GRADUS_CUDNN_LIBRARY)
      add_library(gradus_cudnn INTERFACE IMPORTED)
      set_target_properties(gradus_cudnn PROPERTIES INTERFACE_LINK_LIBRARIES "${GRADUS_CUDNN_LIBRARY}")
    endif()
  endif()
endif()
