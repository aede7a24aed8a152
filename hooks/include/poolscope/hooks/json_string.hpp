// JSON string literals for poolscope's hand-written JSON writers (jsonl_hook, the trace writer).
//
//   std::string out;
//   poolscope::hooks::append_json_string(out, "a \"name\"\n");   // appends "a \"name\"\n"
//
// Thread safety: a pure function. Cost: one pass over the input, no allocation beyond `out`.
#pragma once

#include <string>
#include <string_view>

namespace poolscope::hooks {

/// Appends `s` to `out` as a JSON string literal: RFC 8259 escapes, and valid UTF-8 whatever `s`
/// holds (each byte that starts no valid UTF-8 sequence becomes U+FFFD).
void append_json_string(std::string& out, std::string_view s);

}  // namespace poolscope::hooks
