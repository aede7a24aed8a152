#include "poolscope/error.hpp"

#include <cstdint>
#include <cstdio>
#include <utility>

namespace poolscope {

namespace {
std::string api_message(const std::string& api, int code, const std::string& name,
                        const std::string& call, const std::string& file, int line) {
  return api + " error " + name + " (" + std::to_string(code) + ") in " + call + " at " + file +
         ":" + std::to_string(line);
}
}  // namespace

cuda_error::cuda_error(std::string api, int code, std::string error_name, std::string call,
                       std::string file, int line)
    : runtime_error(api_message(api, code, error_name, call, file, line)),
      api_(std::move(api)),
      code_(code),
      error_name_(std::move(error_name)),
      call_(std::move(call)),
      file_(std::move(file)),
      line_(line) {}

std::string format_bytes(std::size_t bytes) {
  static constexpr const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 6) {
    value /= 1024.0;
    ++unit;
  }
  char buf[64];
  if (unit == 0) {
    std::snprintf(buf, sizeof buf, "%zu B", bytes);
  } else {
    std::snprintf(buf, sizeof buf, "%.2f %s (%zu B)", value, units[unit], bytes);
  }
  return buf;
}

out_of_memory::out_of_memory(std::string allocator, oom_context context, std::string cause)
    : context_(context), cause_(std::move(cause)) {
  message_ = "poolscope: out of memory in " + allocator + " (device " +
             std::to_string(context_.device) + "): requested " + format_bytes(context_.requested) +
             "; reserved " + format_bytes(context_.reserved) + ", in use " +
             format_bytes(context_.in_use) + ", largest free block " +
             format_bytes(context_.largest_free_block) + ", cached on other streams " +
             format_bytes(context_.cached_other_streams) + ", limit " +
             (context_.limit == SIZE_MAX ? std::string("none") : format_bytes(context_.limit)) +
             ". Cause: " + cause_;
}

namespace detail {
void throw_api_error(const char* api, int code, const char* error_name, const char* call,
                     const char* file, int line) {
  throw cuda_error(api, code, error_name != nullptr ? error_name : "unknown", call, file, line);
}
}  // namespace detail

}  // namespace poolscope
