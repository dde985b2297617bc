# Helpers that register GoogleTest programs with ctest, labelled by the folder they test.
#   ipupod_add_test(NAME <name> LABEL <folder> SOURCES <...> LIBS <...>)
#   ipupod_add_mpi_test(NAME <name> LABEL <folder> RANKS <n> SOURCES <...> LIBS <...>)
# MPI tests run as real processes under mpiexec and also carry the label "mpi". Every test
# remembers clean data scans (host/data_scan.hpp) in the build tree, not in the user's cache.

set(IPUPOD_MPIEXEC_FLAGS --oversubscribe --allow-run-as-root CACHE STRING "Extra mpiexec flags for MPI tests")

function(ipupod_add_test)
  cmake_parse_arguments(T "" "NAME;LABEL;TIMEOUT" "SOURCES;LIBS" ${ARGN})
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} GTest::gtest GTest::gtest_main)
  add_test(NAME ${T_NAME} COMMAND ${T_NAME})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  set_tests_properties(${T_NAME} PROPERTIES LABELS "${T_LABEL}" TIMEOUT ${T_TIMEOUT}
    ENVIRONMENT "IPUPOD_SOURCE_DIR=${PROJECT_SOURCE_DIR};IPUPOD_CACHE_DIR=${PROJECT_BINARY_DIR}/test-cache")
endfunction()

# One executable, run at each of RANKS (a list, e.g. "1;2;4") as a separate ctest entry.
function(ipupod_add_mpi_test)
  cmake_parse_arguments(T "" "NAME;LABEL;TIMEOUT" "SOURCES;LIBS;RANKS" ${ARGN})
  add_executable(${T_NAME} ${T_SOURCES} ${PROJECT_SOURCE_DIR}/tests/mpi_test_main.cpp)
  target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} MPI::MPI_CXX GTest::gtest)
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  foreach(n IN LISTS T_RANKS)
    add_test(NAME ${T_NAME}_np${n}
      COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${n} ${IPUPOD_MPIEXEC_FLAGS}
              $<TARGET_FILE:${T_NAME}>)
    set_tests_properties(${T_NAME}_np${n} PROPERTIES LABELS "${T_LABEL};mpi" TIMEOUT ${T_TIMEOUT}
      ENVIRONMENT "IPUPOD_SOURCE_DIR=${PROJECT_SOURCE_DIR};IPUPOD_CACHE_DIR=${PROJECT_BINARY_DIR}/test-cache;OMPI_MCA_rmaps_base_oversubscribe=1")
    # Open MPI's own start-up allocations (some in dlopen'ed plugins no suppression file can
    # name) look like leaks to LeakSanitizer; ASan and UBSan stay on, leak checks are skipped.
    if(IPUPOD_SANITIZE)
      set_property(TEST ${T_NAME}_np${n} APPEND PROPERTY ENVIRONMENT "ASAN_OPTIONS=detect_leaks=0")
    endif()
  endforeach()
endfunction()
