# Writes OUTPUT: a C++ source defining `std::string_view NAME()` that returns INPUT's bytes, so a
# static page ships inside the binary. Run at build time (add_custom_command).
file(READ "${INPUT}" content HEX)
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "'\\\\x\\1'," bytes "${content}")
file(WRITE "${OUTPUT}.tmp"
  "// Generated from ${INPUT} by embed_file.cmake; do not edit.\n"
  "#include \"${HEADER}\"\n\nnamespace specula::server {\n\nnamespace {\nconstexpr char kBytes[] = {${bytes}0};\n}\n\n"
  "std::string_view ${NAME}() { return {kBytes, sizeof(kBytes) - 1}; }\n\n}  // namespace specula::server\n")
file(RENAME "${OUTPUT}.tmp" "${OUTPUT}")
