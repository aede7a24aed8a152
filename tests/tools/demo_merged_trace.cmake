# ctest tools.mpi.demo_merged_trace (and tools.srun.demo_merged_trace, MPIEXEC being
# tests/support/srun_launch.sh): `mpirun -np 3 poolscope demo --devices host:1 --trace t.json`
# passes every check and leaves a merged trace, t.json, that `poolscope trace check` accepts and
# whose summary has a process per rank; `poolscope trace merge` joins the ranks' traces alike by
# hand, and `poolscope report` shows the ranks' reports side by side and summed.
#   cmake -DCLI=... -DMPIEXEC=... -DWORK_DIR=... -P demo_merged_trace.cmake
include(${CMAKE_CURRENT_LIST_DIR}/cli_run.cmake)
launch_demo("${MPIEXEC}" 3)
foreach(r 0 1 2)
  if(NOT EXISTS "${WORK_DIR}/t.rank${r}.json")
    message(FATAL_ERROR "rank ${r} wrote no t.rank${r}.json")
  endif()
endforeach()
cli_run(out "poolscope trace check t.json" trace check t.json)
cli_run(out "poolscope trace summary t.json" trace summary t.json)
foreach(r 0 1 2)
  if(NOT out MATCHES "\n  rank ${r}: 1 device\\(s\\), compute [^\n]*overlap ratio")
    message(FATAL_ERROR "the summary of t.json has no line for rank ${r}:\n${out}")
  endif()
endforeach()
if(NOT out MATCHES "of 3 ranks" OR NOT out MATCHES "clocks: ")
  message(FATAL_ERROR "the summary of t.json names no 3 ranks or no clock alignment:\n${out}")
endif()
execute_process(COMMAND "${CLI}" trace merge -o again.json t.rank2.json t.rank0.json t.rank1.json
  WORKING_DIRECTORY "${WORK_DIR}" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "merged 3 rank trace\\(s\\) of 3 into again.json")
  message(FATAL_ERROR "poolscope trace merge exited with ${rc}:\n${out}\n${err}")
endif()
execute_process(COMMAND "${CLI}" trace check "${WORK_DIR}/again.json" RESULT_VARIABLE rc
  OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "poolscope trace check again.json exited with ${rc}:\n${out}\n${err}")
endif()
execute_process(COMMAND "${CLI}" report r.rank0.json r.rank1.json r.rank2.json
  WORKING_DIRECTORY "${WORK_DIR}" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "function profiles summed over 3 ranks"
   OR NOT out MATCHES "rank 2 calls, cpu")
  message(FATAL_ERROR "poolscope report of the 3 ranks exited with ${rc}:\n${out}\n${err}")
endif()
file(REMOVE_RECURSE "${WORK_DIR}")
