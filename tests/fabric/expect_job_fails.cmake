# ctest helper: runs an MPI job (COMMAND, a |-separated list) that must fail: it passes only if
# the job ends with a non-zero status before TIMEOUT seconds and its output contains EXPECT.
string(REPLACE "|" ";" command "${COMMAND}")
string(TIMESTAMP started "%s")
execute_process(COMMAND ${command} RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err
                TIMEOUT ${TIMEOUT})
string(TIMESTAMP finished "%s")
math(EXPR seconds "${finished} - ${started}")
message(STATUS "job ended after about ${seconds} s with status '${result}'\n${out}\n${err}")
if(NOT result MATCHES "^[0-9]+$")
  message(FATAL_ERROR "the job did not end by itself within ${TIMEOUT} s (${result}): a rank hangs")
endif()
if(result EQUAL 0)
  message(FATAL_ERROR "the job exited with status 0 although a rank died")
endif()
if(NOT "${out}${err}" MATCHES "${EXPECT}")
  message(FATAL_ERROR "the job's output does not mention '${EXPECT}'")
endif()
