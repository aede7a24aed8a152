# ctest tools.hosts.demo_two_hosts: `poolscope demo --devices host:1 --trace t.json --report
# r.json` on 4 ranks over two hosts (tests/support/two_hosts.sh: ranks 0-1 on nodeA, 2-3 on nodeB,
# TCP between them, nodeB's working directory a disk of its own) passes every check; rank 0 ends
# with every rank's trace and report (nodeB's sent to it), `poolscope report` shows the four, and
# the merged trace passes `poolscope trace check`, its summary naming both hosts, aligning their
# clocks and joining every piece between ranks.
#   cmake -DCLI=... -DMPIEXEC=.../two_hosts.sh -DWORK_DIR=... -P demo_two_hosts.cmake
include(${CMAKE_CURRENT_LIST_DIR}/cli_run.cmake)
launch_demo("${MPIEXEC}" 4)
foreach(r 0 1 2 3)
  foreach(f t r)
    if(NOT EXISTS "${WORK_DIR}/${f}.rank${r}.json")
      message(FATAL_ERROR "rank 0's host has no ${f}.rank${r}.json:\n${out}")
    endif()
  endforeach()
endforeach()
cli_run(out "poolscope report of the 4 ranks" report r.rank0.json r.rank1.json r.rank2.json
  r.rank3.json)
if(NOT out MATCHES "function profiles summed over 4 ranks" OR NOT out MATCHES "rank 3 calls, cpu")
  message(FATAL_ERROR "poolscope report did not show the 4 ranks side by side and summed:\n${out}")
endif()
cli_run(out "poolscope trace check t.json" trace check t.json)
cli_run(out "poolscope trace summary t.json" trace summary t.json)
foreach(r 0 1)
  if(NOT out MATCHES "rank ${r}: nodeA \\(pid")
    message(FATAL_ERROR "the summary does not put rank ${r} on nodeA:\n${out}")
  endif()
endforeach()
foreach(r 2 3)
  if(NOT out MATCHES "rank ${r}: nodeB \\(pid")
    message(FATAL_ERROR "the summary does not put rank ${r} on nodeB:\n${out}")
  endif()
endforeach()
if(NOT out MATCHES "estimated skew between hosts")
  message(FATAL_ERROR "the summary aligned no clocks between the hosts:\n${out}")
endif()
if(NOT out MATCHES "piece flows between ranks: [1-9][0-9]* \\(0 sends or receives left unjoined")
  message(FATAL_ERROR "the merged trace left pieces between ranks unjoined:\n${out}")
endif()
file(REMOVE_RECURSE "${WORK_DIR}")
