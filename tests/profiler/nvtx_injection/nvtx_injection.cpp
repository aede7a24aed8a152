// A minimal NVTX tool for tests on machines without Nsight: an injection library that NVTX loads
// from NVTX_INJECTION64_PATH and that records the calls it receives.
//
//   NVTX_INJECTION64_PATH=.../libpoolscope_nvtx_injection.so  ./app    # before any NVTX call
//
// How NVTX injection works (NVTX3 headers, nvtxDetail/nvtxInit.h and nvtxExtInit.h):
// - core and domain functions: on the first NVTX call the application's NVTX instance dlopens
//   the library and calls its InitializeInjectionNvtx2(getExportTable). The tool fetches the
//   NVTX_ETID_CALLBACKS table, asks it for each module's function table (CORE, CORE2, ...) and
//   writes its own function pointers into the slots it handles; NVTX turns the rest into no-ops.
// - extension modules (the memory API of nvToolsExtMem.h): on the first call of a module's
//   function NVTX loads the same library and calls InitializeInjectionNvtxExtension(moduleInfo)
//   once per module; the tool fills moduleInfo->segments[0].functionSlots[NVTX3EXT_CBID_*].
//
// Recorded calls (one JSON object per line): DomainCreateA, DomainRegisterStringA,
// DomainNameCategoryA, DomainRangePushEx, DomainRangePop, DomainMarkEx (and the core
// RangePushA/RangePop/MarkA/NameCategoryA), MemHeapRegister, MemHeapUnregister,
// MemRegionsRegister (a line per region), MemRegionsUnregister (a line per region).
// The lines are kept in memory (read them with poolscope_nvtx_injection_copy, see below) and,
// when POOLSCOPE_NVTX_LOG names a file, appended to it as well.
//
// Thread safety: every callback takes one mutex. Memory: at most 1 << 19 lines are kept; later
// ones are counted in poolscope_nvtx_injection_dropped().
#define NVTX_NO_IMPL
#include <nvtx3/nvToolsExt.h>
#include <nvtx3/nvToolsExtMem.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace {

constexpr std::size_t k_max_lines = std::size_t{1} << 19;

struct domain_entry {
  std::string name;
};
struct string_entry {
  domain_entry* domain;
  std::string text;
};

struct tool_state {
  std::mutex mutex;
  std::deque<domain_entry> domains;
  std::deque<string_entry> strings;
  std::vector<std::string> lines;
  std::uint64_t dropped = 0;
  std::map<std::pair<std::uint64_t, const void*>, int> depth;  // (thread, domain) -> open ranges
  std::FILE* file = nullptr;
  int initialized = 0;  // bit 0: core (InitializeInjectionNvtx2), bit 1: memory module
};

tool_state& tool() {
  static auto* t = new tool_state;  // leaked: NVTX may call in during static destruction
  return *t;
}

std::uint64_t tid() {
  return static_cast<std::uint64_t>(::syscall(SYS_gettid));
}

void append_escaped(std::string& out, const char* s) {
  out += '"';
  for (; s != nullptr && *s != '\0'; ++s) {
    const char c = *s;
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      out += buf;
    } else {
      out += c;
    }
  }
  out += '"';
}

// A JSON line builder: line("DomainRangePushEx").str("message", m).num("category", 4).done().
class line {
 public:
  explicit line(const char* call) {
    text_ = "{\"call\":\"";
    text_ += call;
    text_ += "\",\"tid\":" + std::to_string(tid());
  }
  line& str(const char* key, const char* value) {
    text_ += ",\"";
    text_ += key;
    text_ += "\":";
    if (value == nullptr) {
      text_ += "null";
    } else {
      append_escaped(text_, value);
    }
    return *this;
  }
  line& num(const char* key, std::uint64_t value) {
    text_ += ",\"";
    text_ += key;
    text_ += "\":" + std::to_string(value);
    return *this;
  }
  line& ptr(const char* key, const void* value) {
    return num(key, reinterpret_cast<std::uintptr_t>(value));
  }
  // Caller holds the tool mutex.
  void commit(tool_state& t) {
    text_ += '}';
    if (t.file != nullptr) {
      std::fprintf(t.file, "%s\n", text_.c_str());
      std::fflush(t.file);
    }
    if (t.lines.size() >= k_max_lines) {
      ++t.dropped;
      return;
    }
    t.lines.push_back(std::move(text_));
  }

 private:
  std::string text_;
};

const char* domain_name(nvtxDomainHandle_t d) {
  return d == nullptr ? "" : reinterpret_cast<domain_entry*>(d)->name.c_str();
}

// The message of an event attribute structure as text (registered strings resolved).
std::string message_of(const nvtxEventAttributes_t* a) {
  if (a == nullptr) {
    return {};
  }
  switch (a->messageType) {
    case NVTX_MESSAGE_TYPE_ASCII:
      return a->message.ascii != nullptr ? a->message.ascii : "";
    case NVTX_MESSAGE_TYPE_REGISTERED:
      return a->message.registered != nullptr
                 ? reinterpret_cast<string_entry*>(a->message.registered)->text
                 : "";
    default:
      return "<unsupported message type " + std::to_string(a->messageType) + ">";
  }
}

void attributes(line& l, const nvtxEventAttributes_t* a) {
  const std::string m = message_of(a);
  l.str("message", m.c_str());
  if (a != nullptr) {
    l.num("message_type", static_cast<std::uint64_t>(a->messageType));
    l.num("category", a->category);
    l.num("color", a->color);
    l.num("color_type", static_cast<std::uint64_t>(a->colorType));
    l.num("payload_type", static_cast<std::uint64_t>(a->payloadType));
    l.num("payload", a->payloadType == NVTX_PAYLOAD_TYPE_UNSIGNED_INT64 ? a->payload.ullValue : 0);
  }
}

// ---- core2 (domain) module -------------------------------------------------------------------

nvtxDomainHandle_t NVTX_API domain_create_a(const char* name) {
  auto& t = tool();
  std::lock_guard lock(t.mutex);
  domain_entry& d = t.domains.emplace_back(domain_entry{name != nullptr ? name : ""});
  line("DomainCreateA").str("domain", d.name.c_str()).ptr("handle", &d).commit(t);
  return reinterpret_cast<nvtxDomainHandle_t>(&d);
}

nvtxStringHandle_t NVTX_API domain_register_string_a(nvtxDomainHandle_t domain, const char* s) {
  // A C entry point may not throw: without memory (the out-of-host-memory tests make operator
  // new fail) the string is not registered, as a C tool would answer (a null handle).
  try {
    auto& t = tool();
    std::lock_guard lock(t.mutex);
    string_entry& e = t.strings.emplace_back(
        string_entry{reinterpret_cast<domain_entry*>(domain), s != nullptr ? s : ""});
    line("DomainRegisterStringA")
        .str("domain", domain_name(domain))
        .str("string", e.text.c_str())
        .ptr("handle", &e)
        .commit(t);
    return reinterpret_cast<nvtxStringHandle_t>(&e);
  } catch (...) {
    return nullptr;
  }
}

void NVTX_API domain_name_category_a(nvtxDomainHandle_t domain, uint32_t category,
                                     const char* name) {
  auto& t = tool();
  std::lock_guard lock(t.mutex);
  line("DomainNameCategoryA")
      .str("domain", domain_name(domain))
      .num("category", category)
      .str("name", name)
      .commit(t);
}

int NVTX_API domain_range_push_ex(nvtxDomainHandle_t domain, const nvtxEventAttributes_t* a) {
  auto& t = tool();
  std::lock_guard lock(t.mutex);
  int& depth = t.depth[{tid(), domain}];
  line l("DomainRangePushEx");
  l.str("domain", domain_name(domain)).num("depth", static_cast<std::uint64_t>(depth));
  attributes(l, a);
  l.commit(t);
  return depth++;
}

int NVTX_API domain_range_pop(nvtxDomainHandle_t domain) {
  auto& t = tool();
  std::lock_guard lock(t.mutex);
  int& depth = t.depth[{tid(), domain}];
  const int level = depth > 0 ? --depth : -1;
  line("DomainRangePop")
      .str("domain", domain_name(domain))
      .num("depth", static_cast<std::uint64_t>(level < 0 ? 0 : level))
      .num("underflow", level < 0 ? 1 : 0)
      .commit(t);
  return level;
}

void NVTX_API domain_mark_ex(nvtxDomainHandle_t domain, const nvtxEventAttributes_t* a) {
  auto& t = tool();
  std::lock_guard lock(t.mutex);
  line l("DomainMarkEx");
  l.str("domain", domain_name(domain));
  attributes(l, a);
  l.commit(t);
}

// ---- core module (no domain) -----------------------------------------------------------------

int NVTX_API range_push_a(const char* message) {
  auto& t = tool();
  std::lock_guard lock(t.mutex);
  int& depth = t.depth[{tid(), nullptr}];
  line("RangePushA").str("domain", "").str("message", message).num("depth", depth).commit(t);
  return depth++;
}

int NVTX_API range_pop() {
  return domain_range_pop(nullptr);
}

void NVTX_API mark_a(const char* message) {
  auto& t = tool();
  std::lock_guard lock(t.mutex);
  line("MarkA").str("domain", "").str("message", message).commit(t);
}

void NVTX_API name_category_a(uint32_t category, const char* name) {
  domain_name_category_a(nullptr, category, name);
}

// ---- memory module ---------------------------------------------------------------------------

nvtxMemHeapHandle_t NVTX_API mem_heap_register(nvtxDomainHandle_t domain,
                                               const nvtxMemHeapDesc_t* desc) {
  auto& t = tool();
  std::lock_guard lock(t.mutex);
  const void* ptr = nullptr;
  std::size_t size = 0;
  if (desc != nullptr && desc->type == NVTX_MEM_TYPE_VIRTUAL_ADDRESS &&
      desc->typeSpecificDesc != nullptr) {
    const auto* r = static_cast<const nvtxMemVirtualRangeDesc_t*>(desc->typeSpecificDesc);
    ptr = r->ptr;
    size = r->size;
  }
  // For virtual-address heaps the heap's address is its handle (nvToolsExtMem.h).
  line("MemHeapRegister")
      .str("domain", domain_name(domain))
      .num("usage", desc != nullptr ? desc->usage : 0)
      .num("type", desc != nullptr ? desc->type : 0)
      .num("category", desc != nullptr ? desc->category : 0)
      .ptr("ptr", ptr)
      .num("size", size)
      .ptr("handle", ptr)
      .commit(t);
  return reinterpret_cast<nvtxMemHeapHandle_t>(const_cast<void*>(ptr));
}

void NVTX_API mem_heap_unregister(nvtxDomainHandle_t domain, nvtxMemHeapHandle_t heap) {
  auto& t = tool();
  std::lock_guard lock(t.mutex);
  line("MemHeapUnregister").str("domain", domain_name(domain)).ptr("heap", heap).commit(t);
}

void NVTX_API mem_regions_register(nvtxDomainHandle_t domain,
                                   const nvtxMemRegionsRegisterBatch_t* b) {
  auto& t = tool();
  std::lock_guard lock(t.mutex);
  if (b == nullptr || b->regionType != NVTX_MEM_TYPE_VIRTUAL_ADDRESS) {
    line("MemRegionsRegister").str("domain", domain_name(domain)).num("unsupported", 1).commit(t);
    return;
  }
  const auto* base = static_cast<const unsigned char*>(b->regionDescElements);
  for (std::size_t i = 0; i < b->regionCount; ++i) {
    const auto* r =
        reinterpret_cast<const nvtxMemVirtualRangeDesc_t*>(base + i * b->regionDescElementSize);
    line("MemRegionsRegister")
        .str("domain", domain_name(domain))
        .ptr("heap", b->heap)
        .ptr("ptr", r->ptr)
        .num("size", r->size)
        .commit(t);
    if (b->regionHandleElementsOut != nullptr) {
      b->regionHandleElementsOut[i] =
          reinterpret_cast<nvtxMemRegionHandle_t>(const_cast<void*>(r->ptr));
    }
  }
}

void NVTX_API mem_regions_unregister(nvtxDomainHandle_t domain,
                                     const nvtxMemRegionsUnregisterBatch_t* b) {
  auto& t = tool();
  std::lock_guard lock(t.mutex);
  if (b == nullptr) {
    return;
  }
  const auto* base = reinterpret_cast<const unsigned char*>(b->refElements);
  for (std::size_t i = 0; i < b->refCount; ++i) {
    const auto* ref = reinterpret_cast<const nvtxMemRegionRef_t*>(base + i * b->refElementSize);
    line("MemRegionsUnregister")
        .str("domain", domain_name(domain))
        .num("ref_type", b->refType)
        .ptr("ptr", b->refType == NVTX_MEM_REGION_REF_TYPE_POINTER
                        ? ref->pointer
                        : reinterpret_cast<const void*>(ref->handle))
        .commit(t);
  }
}

template <typename Fn>
void set_slot(NvtxFunctionTable table, unsigned int size, unsigned int id, Fn fn) {
  if (table != nullptr && id < size && table[id] != nullptr) {
    *table[id] = reinterpret_cast<NvtxFunctionPointer>(fn);
  }
}

}  // namespace

extern "C" {

/// NVTX core entry point: attaches to the core and domain (CORE2) modules.
__attribute__((visibility("default"))) int InitializeInjectionNvtx2(
    NvtxGetExportTableFunc_t get_export_table) {
  if (get_export_table == nullptr) {
    return 0;
  }
  const auto* callbacks =
      static_cast<const NvtxExportTableCallbacks*>(get_export_table(NVTX_ETID_CALLBACKS));
  if (callbacks == nullptr || callbacks->GetModuleFunctionTable == nullptr) {
    return 0;
  }
  const auto* version =
      static_cast<const NvtxExportTableVersionInfo*>(get_export_table(NVTX_ETID_VERSIONINFO));
  if (version != nullptr && version->SetInjectionNvtxVersion != nullptr) {
    version->SetInjectionNvtxVersion(NVTX_VERSION);
  }
  NvtxFunctionTable core = nullptr;
  unsigned int core_size = 0;
  NvtxFunctionTable core2 = nullptr;
  unsigned int core2_size = 0;
  if (callbacks->GetModuleFunctionTable(NVTX_CB_MODULE_CORE, &core, &core_size) == 0 ||
      callbacks->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &core2, &core2_size) == 0) {
    return 0;
  }
  set_slot(core, core_size, NVTX_CBID_CORE_MarkA, &mark_a);
  set_slot(core, core_size, NVTX_CBID_CORE_RangePushA, &range_push_a);
  set_slot(core, core_size, NVTX_CBID_CORE_RangePop, &range_pop);
  set_slot(core, core_size, NVTX_CBID_CORE_NameCategoryA, &name_category_a);
  set_slot(core2, core2_size, NVTX_CBID_CORE2_DomainCreateA, &domain_create_a);
  set_slot(core2, core2_size, NVTX_CBID_CORE2_DomainRegisterStringA, &domain_register_string_a);
  set_slot(core2, core2_size, NVTX_CBID_CORE2_DomainNameCategoryA, &domain_name_category_a);
  set_slot(core2, core2_size, NVTX_CBID_CORE2_DomainRangePushEx, &domain_range_push_ex);
  set_slot(core2, core2_size, NVTX_CBID_CORE2_DomainRangePop, &domain_range_pop);
  set_slot(core2, core2_size, NVTX_CBID_CORE2_DomainMarkEx, &domain_mark_ex);

  auto& t = tool();
  std::lock_guard lock(t.mutex);
  if (const char* path = std::getenv("POOLSCOPE_NVTX_LOG"); path != nullptr && t.file == nullptr) {
    t.file = std::fopen(path, "a");
  }
  t.initialized |= 1;
  return 1;
}

/// NVTX extension entry point: attaches to the memory module; other modules are declined.
__attribute__((visibility("default"))) int InitializeInjectionNvtxExtension(
    nvtxExtModuleInfo_t* info) {
  if (info == nullptr || info->moduleId != NVTX_EXT_MODULEID_MEM || info->segmentsCount < 1 ||
      info->segments == nullptr) {
    return 1;  // not ours: NVTX leaves that module's functions as no-ops
  }
  nvtxExtModuleSegment_t& seg = info->segments[0];
  auto set = [&seg](std::size_t id, auto fn) {
    if (id < seg.slotCount) {
      seg.functionSlots[id] = reinterpret_cast<intptr_t>(fn);
    }
  };
  set(NVTX3EXT_CBID_nvtxMemHeapRegister, &mem_heap_register);
  set(NVTX3EXT_CBID_nvtxMemHeapUnregister, &mem_heap_unregister);
  set(NVTX3EXT_CBID_nvtxMemRegionsRegister, &mem_regions_register);
  set(NVTX3EXT_CBID_nvtxMemRegionsUnregister, &mem_regions_unregister);
  auto& t = tool();
  std::lock_guard lock(t.mutex);
  t.initialized |= 2;
  return 1;
}

/// Bit 0: NVTX attached the core/domain callbacks; bit 1: the memory module.
__attribute__((visibility("default"))) int poolscope_nvtx_injection_initialized(void) {
  auto& t = tool();
  std::lock_guard lock(t.mutex);
  return t.initialized;
}

/// Copies the recorded lines ('\n'-separated) into buf (at most cap - 1 bytes, NUL-terminated
/// when cap > 0); returns the full length, so a call with cap = 0 sizes the buffer.
__attribute__((visibility("default"))) std::size_t poolscope_nvtx_injection_copy(char* buf,
                                                                                 std::size_t cap) {
  auto& t = tool();
  std::lock_guard lock(t.mutex);
  std::string all;
  for (const auto& l : t.lines) {
    all += l;
    all += '\n';
  }
  if (buf != nullptr && cap > 0) {
    const std::size_t n = all.size() < cap - 1 ? all.size() : cap - 1;
    std::memcpy(buf, all.data(), n);
    buf[n] = '\0';
  }
  return all.size();
}

/// Forgets the recorded lines (domains and strings stay registered).
__attribute__((visibility("default"))) void poolscope_nvtx_injection_clear(void) {
  auto& t = tool();
  std::lock_guard lock(t.mutex);
  t.lines.clear();
  t.dropped = 0;
}

/// Lines not kept because the buffer was full.
__attribute__((visibility("default"))) std::uint64_t poolscope_nvtx_injection_dropped(void) {
  auto& t = tool();
  std::lock_guard lock(t.mutex);
  return t.dropped;
}

}  // extern "C"
