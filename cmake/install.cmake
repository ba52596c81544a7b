# `cmake --install build --prefix P`: the `colossus` binary, the public headers
# (P/include/colossus/...), the layer libraries and the CMake package
# P/lib/cmake/Colossus, so an outside project can write
#   find_package(Colossus REQUIRED)
#   target_link_libraries(app PRIVATE Colossus::colossus)
# (docs/cpp-api.md, examples/cpp/). Only usage requirements are exported: the
# warning flags stay with our own targets (cmake/colossus_target.cmake).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# The libraries a C++ trainer links: `colossus` (booster and its plugins,
# models, data, optimizers, cluster, checkpoints, metrics) and the layers it
# pulls in, plus inference (generation) and the MoE plugin. The CLI-only parts
# (launcher, server, the TOML trainer) are not part of the package.
set(colossus_exported_targets
  colossus colossus_options
  colossus_core colossus_kernels colossus_cluster colossus_checkpoint colossus_chat_template colossus_data
  colossus_models colossus_optim colossus_amp colossus_metrics colossus_parallel colossus_zero colossus_lora
  colossus_booster colossus_inference colossus_moe)
if(COLOSSUS_WITH_CUDA)
  list(APPEND colossus_exported_targets colossus_cuda colossus_cuda_kernels)
endif()

install(TARGETS ${colossus_exported_targets} EXPORT ColossusTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(EXPORT ColossusTargets NAMESPACE Colossus:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Colossus)

# Headers keep their include paths: #include "colossus/booster/booster.h".
# Those of the parts left out above are left out too (they would include
# CLI11, toml++ or cpp-httplib, which the package does not look for).
install(DIRECTORY ${CMAKE_SOURCE_DIR}/colossus/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/colossus
        FILES_MATCHING PATTERN "*.h"
        PATTERN "cli" EXCLUDE PATTERN "launcher" EXCLUDE PATTERN "apps" EXCLUDE PATTERN "serving" EXCLUDE)

# The binary finds libtorch where this build found it (the wheel is not
# copied). Named explicitly: CMake leaves directories inside the project (the
# .venv) out of INSTALL_RPATH_USE_LINK_PATH, which covers the rest (MPI).
get_filename_component(colossus_torch_lib_dir "${COLOSSUS_TORCH_ROOT}/lib" REALPATH)
set_target_properties(colossus_cli PROPERTIES INSTALL_RPATH "${colossus_torch_lib_dir}" INSTALL_RPATH_USE_LINK_PATH ON)
install(TARGETS colossus_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

# Where this build found torch: the package's fallback when its user's
# CMAKE_PREFIX_PATH does not name one (ColossusConfig.cmake.in).
get_filename_component(COLOSSUS_INSTALL_TORCH_DIR "${Torch_DIR}" REALPATH)
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/ColossusConfig.cmake.in
                              ${CMAKE_BINARY_DIR}/package/ColossusConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Colossus)
write_basic_package_version_file(${CMAKE_BINARY_DIR}/package/ColossusConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES ${CMAKE_BINARY_DIR}/package/ColossusConfig.cmake ${CMAKE_BINARY_DIR}/package/ColossusConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Colossus)

# Everything the install copies, as one target: the package test
# (tests/package) builds it first, a no-op after `make build`.
add_custom_target(colossus_package_contents)
foreach(target IN LISTS colossus_exported_targets)
  get_target_property(type ${target} TYPE)
  if(NOT type STREQUAL "INTERFACE_LIBRARY")
    add_dependencies(colossus_package_contents ${target})
  endif()
endforeach()
add_dependencies(colossus_package_contents colossus_cli)
