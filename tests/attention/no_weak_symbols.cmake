# Fails if an object defines weak symbols (nm types W, V, u): see src/specula/CMakeLists.txt.
foreach(object ${OBJECTS})
  execute_process(COMMAND ${NM} -C --defined-only ${object} OUTPUT_VARIABLE symbols RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "nm failed on ${object}")
  endif()
  string(REGEX MATCHALL "[^\n]* [WVu] [^\n]*" weak "${symbols}")
  # DW.ref.__gxx_personality_v0 is a pointer to the C++ exception personality routine: data
  # shared by every object, no code compiled for AVX-512.
  list(FILTER weak EXCLUDE REGEX "DW\\.ref\\.__gxx_personality_v0")
  if(weak)
    message(FATAL_ERROR "${object} defines weak symbols:\n${weak}")
  endif()
endforeach()
