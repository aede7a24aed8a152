// The profiler scope sites of darray's ops, registered once and shared by the executor and the
// backends (so "darray.add" is one site wherever it is opened).
#pragma once

#include "poolscope/darray/backend.hpp"
#include "poolscope/profiler/scope.hpp"

namespace poolscope::darray::detail {

/// "darray.neg", ... (category darray.compute).
[[nodiscard]] const profiler::scope_site& site_of(unary_op op);
/// "darray.add", ...
[[nodiscard]] const profiler::scope_site& site_of(binary_op op);
/// "darray.sum", ...: a reduction of an array.
[[nodiscard]] const profiler::scope_site& site_of(reduce_op op);
/// "darray.accumulate.sum", ...: a backend's acc = op(acc, src).
[[nodiscard]] const profiler::scope_site& accumulate_site(reduce_op op);
/// "darray.reduce.sum", ...: a backend's reduction of one view.
[[nodiscard]] const profiler::scope_site& reduce_site(reduce_op op);

}  // namespace poolscope::darray::detail
