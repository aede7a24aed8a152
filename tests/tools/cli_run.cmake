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

# launch_demo(<launcher> <ranks>): `<launcher> -np <ranks> ${CLI} demo --devices host:1 --trace
# t.json --report r.json` in a new ${WORK_DIR}, its output in `out`. A launcher that cannot run
# here (exit 77 after "SKIP: why") ends the calling script with its reason, for ctest's
# SKIP_REGULAR_EXPRESSION (a macro: its return() leaves the script); a failure, or a summary
# other than every check of every rank passing (11 each), fails the test.
macro(launch_demo launcher ranks)
  file(REMOVE_RECURSE "${WORK_DIR}")
  file(MAKE_DIRECTORY "${WORK_DIR}")
  execute_process(
    COMMAND "${launcher}" -np ${ranks} "${CLI}" demo --devices host:1 --trace t.json
      --report r.json
    WORKING_DIRECTORY "${WORK_DIR}" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
    TIMEOUT 600)
  if(rc EQUAL 77 AND out MATCHES "^SKIP: ")
    message("${out}")
    return()
  endif()
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "the demo under ${launcher} exited with ${rc}:\n${out}\n${err}")
  endif()
  math(EXPR _checks "11 * ${ranks}")
  if(NOT out MATCHES "all ${_checks} checks passed \\(11 on each of ${ranks} ranks\\)")
    message(FATAL_ERROR "the demo did not pass every check of every rank:\n${out}")
  endif()
endmacro()
