# The verdict of an include rule over the headers (host_core_purity.cmake,
# folder_layers.cmake): fails when no header was checked (a wrong directory
# would otherwise pass) or when any line broke the rule, naming each.
function(loom_include_rule_verdict checked bad broken_sentence passed_sentence)
  if(checked EQUAL 0)
    message(FATAL_ERROR "no headers found under ${LOOM_INCLUDE_DIR}/loom")
  endif()
  if(bad)
    list(JOIN bad "\n  " text)
    message(FATAL_ERROR "${broken_sentence}:\n  ${text}")
  endif()
  message(STATUS "${checked} ${passed_sentence}")
endfunction()
