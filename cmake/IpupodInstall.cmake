# `cmake --install`: the `ipupod` command, its launcher and Slurm scripts, the man page, and the
# libraries with their headers and an exported CMake package, so that a user's own program can
#   find_package(ipupod REQUIRED)   # then link ipupod::pod, ipupod::ipu, ipupod::fabric, ...
# (GNUInstallDirs layout: bin/, lib/, include/<layer>/, lib/cmake/ipupod/, share/).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# Libraries under their short names: ipupod_pod is exported as ipupod::pod, as in the build.
set(ipupod_libraries
  half:ipupod_half json_text:ipupod_json_text cli_checks:ipupod_cli_checks
  fabric:ipupod_fabric host:ipupod_host models:ipupod_models ipu:ipupod_ipu
  datasets:ipupod_datasets pod:ipupod_pod)
set(ipupod_library_targets)
foreach(pair IN LISTS ipupod_libraries)
  string(REPLACE ":" ";" pair "${pair}")
  list(GET pair 0 export_name)
  list(GET pair 1 target)
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${export_name})
  list(APPEND ipupod_library_targets ${target})
endforeach()
install(TARGETS ${ipupod_library_targets} EXPORT ipupodTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# Headers keep their layer folder, as #include "ipu_process/engine.hpp" in the sources.
foreach(layer float16 json_text cli_checks fabric host models ipu_process datasets pod)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${layer}/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/${layer}
          FILES_MATCHING PATTERN "*.hpp" PATTERN "cli" EXCLUDE)
endforeach()
install(EXPORT ipupodTargets NAMESPACE ipupod:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ipupod)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/ipupodConfig.cmake.in
  ${PROJECT_BINARY_DIR}/ipupodConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ipupod)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/ipupodConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/ipupodConfig.cmake ${PROJECT_BINARY_DIR}/ipupodConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ipupod)

# The command, the launcher (which finds `ipupod` on PATH) and the Slurm batch scripts.
install(TARGETS ipupod RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(PROGRAMS ${PROJECT_SOURCE_DIR}/scripts/ipupod-run DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/scripts/slurm/
        DESTINATION ${CMAKE_INSTALL_DATADIR}/ipupod/slurm USE_SOURCE_PERMISSIONS)
install(FILES ${PROJECT_SOURCE_DIR}/scripts/bench_step_torch.py ${PROJECT_SOURCE_DIR}/scripts/bench_input_pil.py
        DESTINATION ${CMAKE_INSTALL_DATADIR}/ipupod)

# The man page, made from `ipupod --help` and each subcommand's by help2man (Debian's help2man).
find_program(IPUPOD_HELP2MAN help2man)
if(IPUPOD_HELP2MAN)
  add_custom_command(
    OUTPUT ${PROJECT_BINARY_DIR}/ipupod.1
    COMMAND ${IPUPOD_HELP2MAN} --no-info --no-discard-stderr
            --name "emulator of a Graphcore IPU pod: train, compile and estimate models"
            --include ${PROJECT_SOURCE_DIR}/cmake/ipupod-man.h2m
            --output ${PROJECT_BINARY_DIR}/ipupod.1 $<TARGET_FILE:ipupod>
    DEPENDS ipupod ${PROJECT_SOURCE_DIR}/cmake/ipupod-man.h2m
    COMMENT "Generating the ipupod(1) man page with help2man")
  add_custom_target(ipupod_man ALL DEPENDS ${PROJECT_BINARY_DIR}/ipupod.1)
  install(FILES ${PROJECT_BINARY_DIR}/ipupod.1 DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)
else()
  message(STATUS "help2man not found: no ipupod(1) man page (Debian package help2man)")
endif()
