# loom_add_mpi_test(name nprocs target): runs `target` under mpiexec with
# nprocs processes. Open MPI refuses to run as root and to start more
# processes than cores unless told, so those flags are added when they apply
# (CI runs as root on 2 cores); LOOM_MPIEXEC_EXTRA_FLAGS adds site flags.
include_guard(GLOBAL)

set(LOOM_MPIEXEC_EXTRA_FLAGS "" CACHE STRING "Extra flags for mpiexec in loom's MPI tests")

function(_loom_mpiexec_flags out)
  set(flags ${MPIEXEC_PREFLAGS})
  execute_process(COMMAND "${MPIEXEC_EXECUTABLE}" --version OUTPUT_VARIABLE version ERROR_QUIET)
  if(version MATCHES "Open MPI|OpenRTE")
    list(APPEND flags --oversubscribe)
    execute_process(COMMAND id -u OUTPUT_VARIABLE uid OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(uid STREQUAL "0")
      list(APPEND flags --allow-run-as-root)
    endif()
  endif()
  list(APPEND flags ${LOOM_MPIEXEC_EXTRA_FLAGS})
  set(${out} ${flags} PARENT_SCOPE)
endfunction()

function(loom_add_mpi_test name nprocs target)
  _loom_mpiexec_flags(flags)
  add_test(NAME "${name}"
           COMMAND "${MPIEXEC_EXECUTABLE}" ${MPIEXEC_NUMPROC_FLAG} ${nprocs} ${flags}
                   $<TARGET_FILE:${target}> ${MPIEXEC_POSTFLAGS} ${ARGN})
  # Open MPI's dlopen'ed components keep allocations past MPI_Finalize and are
  # unloaded before LeakSanitizer can name them, so leak checks (debug
  # preset) are off for MPI runs; AddressSanitizer's other checks stay on.
  set_tests_properties("${name}" PROPERTIES PROCESSORS ${nprocs} TIMEOUT 120
    ENVIRONMENT "ASAN_OPTIONS=detect_leaks=0")
endfunction()
