# pkg-config modules for projects built without CMake (installed to share/pkgconfig: the
# headers are the same for every architecture):
#   c++ app.cpp $(pkg-config --cflags --libs gradus gradus-io)
# gradus is gradus::gradus with gradus::cpu_simd (the DSL needs a compute backend to run);
# gradus-<component> adds what the CMake component of that name brings in. Not here: mpi
# (compile with the MPI implementation's mpicxx) and cuda (nvcc: use the CMake package).
# oneDNN is not assumed: add -DGRADUS_HAVE_DNNL=1 -ldnnl for cpu_simd's oneDNN convolutions.
# Cflags carry -std=c++20 (gradus' minimum); a later -std= on the command line wins.
function(gradus_pkg_config pc_name pc_description pc_requires pc_cflags pc_libs)
  configure_file(${PROJECT_SOURCE_DIR}/cmake/gradus.pc.in ${PROJECT_BINARY_DIR}/pkgconfig/${pc_name}.pc @ONLY)
  install(FILES ${PROJECT_BINARY_DIR}/pkgconfig/${pc_name}.pc DESTINATION ${CMAKE_INSTALL_DATADIR}/pkgconfig)
endfunction()

# cpu_simd's flags: OpenMP threads, and no multiply-add contraction (its CMakeLists.txt says why)
gradus_pkg_config(gradus "Machine-learning models as typed C++20 expressions: the DSL and the CPU backend (cpu_simd)"
  "xtensor xsimd xtl openblas" "-std=c++20 -I\${includedir} -fopenmp -ffp-contract=off" "-fopenmp")
gradus_pkg_config(gradus-io "gradus::io: .npz, .npy and .safetensors files, checkpoints"
  "gradus libzip nlohmann_json" "" "")
gradus_pkg_config(gradus-cluster "gradus::cluster: cluster discovery (TF_CONFIG, Slurm, torchrun, gradus JSON)"
  "gradus nlohmann_json" "" "")
gradus_pkg_config(gradus-net "gradus::net: the network layer of the ZeroMQ communicators"
  "gradus cppzmq" "" "")
gradus_pkg_config(gradus-ring "gradus::ring: the ring all-reduce over ZeroMQ, TCP or shared memory"
  "gradus-net" "" "")
gradus_pkg_config(gradus-ps "gradus::ps: the parameter server over ZeroMQ"
  "gradus-net gradus-cluster" "" "")
