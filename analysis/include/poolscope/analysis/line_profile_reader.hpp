// line_profile_reader: line profiles read back from the JSON document line_profile::to_json
// writes (docs/line_profile.md): what `poolscope report` renders.
//
//   auto p = poolscope::analysis::load_line_profile("alloc.json");
//   std::cout << p.to_text({.threshold_bytes = 1 << 20});
//
// Errors: a document that is not a line profile of this version, a field of the wrong type or
// out of range, nodes nested more than 1024 deep (the profiler writes at most 257 levels) or
// figures whose totals pass 2^64 - 1 throw poolscope::invalid_argument naming what is wrong.
// Ownership: results are plain values. Thread safety: the functions are reentrant. Cost: linear
// in the document; recursion one level per node level.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "poolscope/profiler/line_profile.hpp"

namespace poolscope::analysis {

/// Parses a document written by line_profile::to_json. Totals are recomputed from the self
/// figures. Throws poolscope::invalid_argument naming what is wrong if `json` is not such a
/// document.
[[nodiscard]] profiler::line_profile line_profile_from_json(std::string_view json);
/// The same, from a document already parsed (a run report's "profiles.line"): nothing is
/// serialised again, so no recursion deeper than the node check allows. Same errors.
[[nodiscard]] profiler::line_profile line_profile_from_json_document(const nlohmann::json& doc);

/// Reads a JSON report written by line_profile::to_json from `path`. Throws
/// poolscope::runtime_error naming the path if it cannot be read, poolscope::invalid_argument
/// if it is not a line profile.
[[nodiscard]] profiler::line_profile load_line_profile(const std::string& path);

/// What `poolscope report FILE` prints: the saved report at `path` as a text tree.
[[nodiscard]] std::string render_line_profile_file(const std::string& path,
                                                   const profiler::text_options& options = {});

}  // namespace poolscope::analysis
