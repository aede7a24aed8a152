// The reshard executor: runs a reshard plan on a backend, piece by piece (or as one transfer
// group), with an event per piece so that work on the new array waits only on the data it reads.
// Internal to darray (distributed_array.cpp's ops call it).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "array_state.hpp"

namespace poolscope::darray::detail {

// How execute_reshard checks a target map it has not planned for before.
enum class map_check {
  none,    ///< the map of an existing array (valid by construction)
  cover,   ///< validate: bounds, devices, and every element covered
  bounds,  ///< validate without the cover check (matmul's row requests)
};

// Called by execute_reshard with the new state and, per destination chunk, how many of its
// first parts are in place (taken from the source on the device, no copy); may enqueue work on
// those parts.
using in_place_ready = std::function<void(const array_state&, const std::vector<std::size_t>&)>;

// Runs the plan of a reshard of `src` into `dst_map`, returning the new state. A map not planned
// for before is first checked as `check` says.
// `in_place` (optional; replica sources moved piece by piece only) is called once, as soon as
// every queue that copies a piece (not a pulled one) has its first copy enqueued, or at the end:
// so compute on the data already in place (a fused op's) is enqueued while the first copies
// run, instead of after the host has issued every piece (the later pieces queue behind those
// copies anyway, which take far longer than their issue), and, with every piece issued, still
// before the compute on what the pieces bring. The plan puts local pieces first, so their parts
// are each chunk's first.
std::shared_ptr<array_state> execute_reshard(const array_state& src,
                                             const darray::index_map& dst_map,
                                             const reshard_options& options, map_check check,
                                             const in_place_ready& in_place = nullptr);

/// The state of `s`, completed to replica mode if it is partial.
std::shared_ptr<const array_state> completed(const std::shared_ptr<const array_state>& s);

}  // namespace poolscope::darray::detail
