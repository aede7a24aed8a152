# cli_run(<out> <what> ARGS...), for the ctest scripts that drive the CLI: runs ${CLI} ARGS in
# ${WORK_DIR} and puts what it printed in <out>; a non-zero exit fails the test, naming <what>.
function(cli_run out what)
  execute_process(COMMAND "${CLI}" ${ARGN} WORKING_DIRECTORY "${WORK_DIR}"
    RESULT_VARIABLE rc OUTPUT_VARIABLE o ERROR_VARIABLE e)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} exited with ${rc}:\n${o}\n${e}")
  endif()
  set(${out} "${o}" PARENT_SCOPE)
endfunction()
