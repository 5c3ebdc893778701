# cpack: what `cmake --install` installs, as a Debian package, and the sources as a tarball.
#   cpack -G DEB                                   libgradus-dev_<version>_<arch>.deb (prefix /usr: the DEB default)
#   cpack -G TGZ --config CPackSourceConfig.cmake  gradus-<version>-src.tar.gz
# Run from the build directory, after `cmake --build` (the .deb carries gradus-run and
# gradus-keygen). tests/cmake (label packaging) builds both and inspects them.
set(CPACK_PACKAGE_NAME libgradus-dev)
set(CPACK_PACKAGE_VENDOR gradus)
set(CPACK_PACKAGE_CONTACT "gradus maintainers <maintainers@users.noreply.a-seed-fc0a1cd5.example>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "${PROJECT_DESCRIPTION}")
set(CPACK_RESOURCE_FILE_README ${PROJECT_SOURCE_DIR}/README.md)

# A development package: the Debian -dev packages of every library the installed targets and
# tools need, so that find_package(gradus COMPONENTS io cluster net ring ps) succeeds after
# `apt install ./libgradus-dev_*.deb`. oneDNN (optional convolutions) is recommended; MPI (for
# gradus::mpi) suggested; CUDA and cuDNN are not Debian main packages (docs/cuda.md).
set(CPACK_DEBIAN_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_DEPENDS
  "libxtensor-dev, libxsimd-dev, libxtensor-blas-dev, libopenblas-openmp-dev | libopenblas-dev, nlohmann-json3-dev, libzip-dev, pkgconf | pkg-config, libzmq3-dev, cppzmq-dev")
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "libdnnl-dev")
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "libopenmpi-dev, openmpi-bin")
# gradus-run's and gradus-keygen's shared libraries (libc, libstdc++, libzmq) through dpkg-shlibdeps
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)

# The source tarball: the tracked tree, without build trees, the data sets, git's own files.
set(CPACK_SOURCE_GENERATOR TGZ)
set(CPACK_SOURCE_PACKAGE_FILE_NAME gradus-${PROJECT_VERSION}-src)
string(REGEX REPLACE "([][+.*()^$?|\\\\])" "\\\\\\1" gradus_source_regex "${PROJECT_SOURCE_DIR}")
set(CPACK_SOURCE_IGNORE_FILES
  "^${gradus_source_regex}/(build|data|\\.git|\\.cache)(/|$)"
  "\\.swp$" "~$" "/__pycache__/")
set(CPACK_VERBATIM_VARIABLES ON)  # the regular expressions above reach CPack as written
include(CPack)
