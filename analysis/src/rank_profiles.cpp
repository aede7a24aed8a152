// The ranks' profiles side by side and summed (rank_profiles.hpp).
#include "poolscope/analysis/rank_profiles.hpp"

#include <algorithm>
#include <cstdio>
#include <map>
#include <tuple>

#include "detail/profile_tree.hpp"
#include "poolscope/error.hpp"

namespace poolscope::analysis {

using profiler::function_profile;
using profiler::line_profile;
using profiler::profile_node;
using profiler::scope_record;

using detail::add_node;
using detail::key_of;

namespace {

std::string ms(std::uint64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f ms", static_cast<double>(ns) / 1e6);
  return buf;
}

std::string mib(std::uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return buf;
}

std::string cell(const std::string& s, std::size_t width) {
  return s.size() >= width ? s + " " : std::string(width - s.size(), ' ') + s + " ";
}

void check_labels(const std::vector<std::string>& labels, std::size_t ranks) {
  if (labels.size() != ranks) {
    throw invalid_argument("side_by_side: " + std::to_string(labels.size()) + " labels for " +
                           std::to_string(ranks) + " profiles");
  }
}

}  // namespace

function_profile sum_profiles(const std::vector<function_profile>& ranks) {
  function_profile out;
  std::map<std::string, scope_record> by_name;
  for (const function_profile& p : ranks) {
    out.gpu_timing = out.gpu_timing || p.gpu_timing;
    out.gpu_pending += p.gpu_pending;
    out.gpu_dropped += p.gpu_dropped;
    out.scopes_lost += p.scopes_lost;
    for (const scope_record& s : p.scopes) {
      auto [it, fresh] = by_name.try_emplace(s.name, s);
      if (fresh) {
        continue;
      }
      scope_record& r = it->second;
      r.calls += s.calls;
      r.cpu_total_ns += s.cpu_total_ns;
      r.cpu_self_ns += s.cpu_self_ns;
      if (s.gpu_total_ns) {
        r.gpu_total_ns = r.gpu_total_ns.value_or(0) + *s.gpu_total_ns;
      }
      r.gpu_samples += s.gpu_samples;
      r.used_bytes += s.used_bytes;
      r.self_used_bytes += s.self_used_bytes;
      r.acquired_bytes += s.acquired_bytes;
      r.self_acquired_bytes += s.self_acquired_bytes;
    }
  }
  for (auto& [name, r] : by_name) {
    out.scopes.push_back(std::move(r));
  }
  std::sort(out.scopes.begin(), out.scopes.end(), [](const scope_record& a, const scope_record& b) {
    return a.cpu_total_ns != b.cpu_total_ns ? a.cpu_total_ns > b.cpu_total_ns : a.name < b.name;
  });
  return out;
}

line_profile sum_profiles(const std::vector<line_profile>& ranks) {
  line_profile out;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    const line_profile& p = ranks[i];
    if (i == 0) {
      out.root.function = p.root.function;
      out.unwinder = p.unwinder;
      out.symbolizer = p.symbolizer;
    }
    add_node(out.root, p.root);
    out.peak_live += p.peak_live;
    out.events += p.events;
    out.unmatched_frees += p.unmatched_frees;
    out.truncated_stacks += p.truncated_stacks;
    out.deferred_events += p.deferred_events;
    out.max_depth = std::max(out.max_depth, p.max_depth);
    out.complete = out.complete && p.complete;
  }
  out.recompute_totals();
  return out;
}

std::string side_by_side(const std::vector<std::string>& labels,
                         const std::vector<function_profile>& ranks, std::size_t top) {
  check_labels(labels, ranks.size());
  const function_profile sum = sum_profiles(ranks);
  constexpr std::size_t w = 22;
  std::string out = cell("scope", 24);
  for (const std::string& l : labels) {
    out += cell(l + " calls, cpu", w);
  }
  out += cell("sum calls, cpu", w) + "\n";
  std::vector<std::uint64_t> totals(ranks.size() + 1, 0);
  std::size_t shown = 0;
  for (const scope_record& s : sum.scopes) {
    if (shown++ == top) {
      break;
    }
    out += cell(s.name.size() > 23 ? s.name.substr(0, 22) + "~" : s.name, 24);
    for (std::size_t r = 0; r < ranks.size(); ++r) {
      const scope_record* mine = ranks[r].find(s.name);
      out += cell(
          mine == nullptr ? "-" : std::to_string(mine->calls) + ", " + ms(mine->cpu_total_ns), w);
    }
    out += cell(std::to_string(s.calls) + ", " + ms(s.cpu_total_ns), w) + "\n";
  }
  // Whole profiles: the outermost scopes' time would count nested ones twice, so the last line
  // sums self time.
  out += cell("(self time, all scopes)", 24);
  for (std::size_t r = 0; r <= ranks.size(); ++r) {
    const function_profile& p = r < ranks.size() ? ranks[r] : sum;
    std::uint64_t self = 0;
    for (const scope_record& s : p.scopes) {
      self += s.cpu_self_ns;
    }
    out += cell(ms(self), w);
  }
  return out + "\n";
}

std::string side_by_side(const std::vector<std::string>& labels,
                         const std::vector<line_profile>& ranks, std::size_t top) {
  check_labels(labels, ranks.size());
  const line_profile sum = sum_profiles(ranks);
  constexpr std::size_t w = 24;
  const auto bytes = [](const profiler::profile_counts& c) {
    return mib(c.used) + ", " + mib(c.acquired);
  };
  std::string out = cell("call site (used, acquired)", 40);
  for (const std::string& l : labels) {
    out += cell(l, w);
  }
  out += cell("sum", w) + "\n";
  // The call sites where the summed tree first branches (above them every stack is the same:
  // main, the launcher's frames).
  std::vector<const profile_node*> path{&sum.root};
  while (path.back()->children.size() == 1) {
    path.push_back(&path.back()->children.front());
  }
  std::vector<const profile_node*> sites;
  for (const profile_node& c : path.back()->children) {
    sites.push_back(&c);
  }
  // The same call site in one rank's tree, or null.
  const auto find_in = [&](const line_profile& p, const profile_node& site) {
    const profile_node* n = &p.root;
    for (std::size_t d = 1; d < path.size() && n != nullptr; ++d) {
      const auto it =
          std::find_if(n->children.begin(), n->children.end(),
                       [&](const profile_node& x) { return key_of(x) == key_of(*path[d]); });
      n = it == n->children.end() ? nullptr : &*it;
    }
    if (n == nullptr) {
      return static_cast<const profile_node*>(nullptr);
    }
    const auto it = std::find_if(n->children.begin(), n->children.end(),
                                 [&](const profile_node& x) { return key_of(x) == key_of(site); });
    return it == n->children.end() ? nullptr : &*it;
  };
  std::stable_sort(sites.begin(), sites.end(), [](const profile_node* a, const profile_node* b) {
    return a->total.used > b->total.used;
  });
  for (std::size_t i = 0; i < sites.size() && i < top; ++i) {
    const std::string label = sites[i]->label();
    // The end of a long label: its file and line say where.
    out += cell(label.size() > 39 ? "~" + label.substr(label.size() - 38) : label, 40);
    for (const line_profile& p : ranks) {
      const profile_node* mine = find_in(p, *sites[i]);
      out += cell(mine == nullptr ? "-" : bytes(mine->total), w);
    }
    out += cell(bytes(sites[i]->total), w) + "\n";
  }
  out += cell("(whole profile)", 40);
  for (const line_profile& p : ranks) {
    out += cell(bytes(p.root.total), w);
  }
  return out + cell(bytes(sum.root.total), w) + "\n";
}

}  // namespace poolscope::analysis
