# `cmake --install <build> --prefix P` — the SDK and runtime, relocatable:
#   P/bin/ciuic-run                        (RUNPATH $ORIGIN/../lib, then LibTorch's folder)
#   P/lib/libciuic_sdk.so*                 the SDK plugins link (RUNPATH $ORIGIN, then LibTorch's)
#   P/lib/libciuic.so*                     the engine ciuic-run uses (no headers; exported only as
#                                          the conformance kit's dependency)
#   P/lib/libciuic_conformance.a, P/bin/ciuic-plugin-check   the conformance kit (core/conformance/;
#                                          headers in include/ciuic/testing/)
#   P/lib/libciuic_*_kit.a                 the kits (static; headers in include/ciuic/kit/)
#   P/lib/ciuic/plugins/libciuic_*.so      (RUNPATH $ORIGIN/../.., then LibTorch's folder)
#   P/include/ciuic/*.h                    (the SDK headers + the generated version.h)
#   P/include/ciuic/kit/*.h                (the kits' headers)
#   P/lib/cmake/Ciuic/                     CiuicConfig.cmake, CiuicConfigVersion.cmake,
#                                          CiuicTargets*.cmake, CiuicPlugin.cmake, CiuicTorch.cmake,
#                                          CiuicConformanceTargets*.cmake
#   P/share/doc/ciuic/                     docs/*.md
#   P/share/ciuic/examples/                examples/ (hello_plugin: a plugin built against P)
# ciuic-run and the plugins come with their own install() rules (apps/, ciuic_add_plugin).
include(CMakePackageConfigHelpers)
set(CIUIC_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/Ciuic)

# ciuic::sdk links ciuic::torch, a target of this build naming LibTorch by absolute paths. The
# installed package must not carry those: its config finds LibTorch again (the same version:
# plugins must match the core's build fingerprint) and defines ciuic::libtorch, which the
# exported ciuic::sdk links instead.
get_target_property(_ciuic_links ciuic_sdk INTERFACE_LINK_LIBRARIES)
set(_ciuic_new_links "")
set(_ciuic_found_torch OFF)
foreach(_l IN LISTS _ciuic_links)
  if(_l STREQUAL "ciuic::torch")
    list(APPEND _ciuic_new_links "$<BUILD_INTERFACE:ciuic::torch>" "$<INSTALL_INTERFACE:ciuic::libtorch>")
    set(_ciuic_found_torch ON)
  else()
    list(APPEND _ciuic_new_links "${_l}")
  endif()
endforeach()
if(NOT _ciuic_found_torch)
  message(FATAL_ERROR "CiuicInstall: ciuic_sdk no longer links ciuic::torch publicly; update the export of LibTorch here")
endif()
set_target_properties(ciuic_sdk PROPERTIES INTERFACE_LINK_LIBRARIES "${_ciuic_new_links}")

install(TARGETS ciuic_sdk EXPORT CiuicTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# libciuic: with the conformance kit, core/conformance/ installs and exports it (for the kit alone).
if(NOT TARGET ciuic_conformance)
  install(TARGETS ciuic LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
endif()
install(DIRECTORY ${PROJECT_SOURCE_DIR}/core/include/ciuic DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h")
install(DIRECTORY DESTINATION ${CMAKE_INSTALL_LIBDIR}/ciuic/plugins)  # exists even without plugins
install(FILES ${CMAKE_BINARY_DIR}/generated/ciuic/version.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/ciuic)
install(EXPORT CiuicTargets NAMESPACE ciuic:: DESTINATION ${CIUIC_INSTALL_CMAKEDIR})

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/CiuicConfig.cmake.in
                              ${CMAKE_BINARY_DIR}/cmake/CiuicConfig.cmake
                              INSTALL_DESTINATION ${CIUIC_INSTALL_CMAKEDIR}
                              PATH_VARS CMAKE_INSTALL_LIBDIR)
# Pre-1.0: a minor version may change the SDK (the plugin API version and the build
# fingerprint are checked again at load time anyway).
write_basic_package_version_file(${CMAKE_BINARY_DIR}/cmake/CiuicConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/cmake/CiuicConfig.cmake ${CMAKE_BINARY_DIR}/cmake/CiuicConfigVersion.cmake
              ${PROJECT_SOURCE_DIR}/cmake/CiuicPlugin.cmake ${PROJECT_SOURCE_DIR}/cmake/CiuicTorch.cmake
        DESTINATION ${CIUIC_INSTALL_CMAKEDIR})

if(EXISTS ${PROJECT_SOURCE_DIR}/docs)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR} FILES_MATCHING PATTERN "*.md")
endif()
install(DIRECTORY ${PROJECT_SOURCE_DIR}/examples/ DESTINATION ${CMAKE_INSTALL_DATADIR}/ciuic/examples
        PATTERN "build*" EXCLUDE)
