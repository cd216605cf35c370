// A timeline of one profiled window, for where the GPU sits idle (there is no nsys on the GPU
// machine). Loaded into any CUDA program by the driver:
//   CUDA_INJECTION64_PATH=/tmp/libdztrace.so DZ_TRACE_OUT=/tmp/trace.csv dayzero bench e2e ...
// It records, through CUPTI's activity API, every kernel, memcpy and memset on the GPU and every
// CUDA runtime call on the host, with the GPU's timestamps, and the two instants of
// cudaProfilerStart / cudaProfilerStop (`bench e2e` brackets its last timed forward with them,
// after a device sync each). At exit: CSV rows kind,start_ns,end_ns,name (kind: window, kernel,
// memcpy, memset, api). kernels/dev/trace/summary.py reads it.
//   nvcc -O2 -std=c++17 -shared -Xcompiler -fPIC -I<cupti include> kernels/dev/trace/cupti_trace.cpp
//        -L<dir of libcupti.so> -lcupti -o /tmp/libdztrace.so
// (nvcc refuses the versioned library file, libcupti.so.2025.3.1 on the GPU machine: link through a
// libcupti.so symlink, as .dev's device scripts do.) With trace_gemm.patch applied and
// DZ_TRACE_GEMM=1 in the same run, kernels/dev/trace/gemm_rates.py gives every dense GEMM's shape
// and rate.
#include <cupti.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace {

#define CUPTI_OK(x)                                                                    \
  do {                                                                                 \
    CUptiResult r_ = (x);                                                              \
    if (r_ != CUPTI_SUCCESS) {                                                         \
      const char* s_ = nullptr;                                                        \
      cuptiGetResultString(r_, &s_);                                                   \
      fprintf(stderr, "[dztrace] %s: %s\n", #x, s_ ? s_ : "?");                        \
      return;                                                                          \
    }                                                                                  \
  } while (0)

struct Row {
  const char* kind;
  uint64_t t0, t1;
  std::string name;
};
std::mutex g_mu;
std::vector<Row> g_rows;
uint64_t g_win0 = 0, g_win1 = 0;
CUpti_SubscriberHandle g_sub;

constexpr size_t kBuf = 8 << 20;

void CUPTIAPI buffer_requested(uint8_t** buf, size_t* size, size_t* max_records) {
  *buf = static_cast<uint8_t*>(aligned_alloc(8, kBuf));
  *size = kBuf;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buf, size_t, size_t valid) {
  CUpti_Activity* rec = nullptr;
  std::lock_guard<std::mutex> lk(g_mu);
  while (cuptiActivityGetNextRecord(buf, valid, &rec) == CUPTI_SUCCESS) {
    switch (rec->kind) {
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
      case CUPTI_ACTIVITY_KIND_KERNEL: {
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
        g_rows.push_back({"kernel", k->start, k->end, k->name ? k->name : "?"});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(rec);
        g_rows.push_back({"memcpy", m->start, m->end, "copy kind " + std::to_string(m->copyKind) + " bytes " + std::to_string(m->bytes)});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(rec);
        g_rows.push_back({"memset", m->start, m->end, "bytes " + std::to_string(m->bytes)});
        break;
      }
      case CUPTI_ACTIVITY_KIND_RUNTIME: {
        const auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(rec);
        const char* n = nullptr;
        cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, a->cbid, &n);
        g_rows.push_back({"api", a->start, a->end, n ? n : "?"});
        break;
      }
      default:
        break;
    }
  }
  free(buf);
}

// cudaProfilerStart's entry and cudaProfilerStop's exit bound the window.
void CUPTIAPI on_api(void*, CUpti_CallbackDomain dom, CUpti_CallbackId cbid, const void* data) {
  if (dom != CUPTI_CB_DOMAIN_RUNTIME_API) return;
  const auto* cb = static_cast<const CUpti_CallbackData*>(data);
  uint64_t t = 0;
  cuptiGetTimestamp(&t);
  std::lock_guard<std::mutex> lk(g_mu);
  if (cbid == CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStart_v4000 && cb->callbackSite == CUPTI_API_ENTER) g_win0 = t;
  if (cbid == CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStop_v4000 && cb->callbackSite == CUPTI_API_EXIT) g_win1 = t;
}

void at_exit() {
  cuptiActivityFlushAll(1);
  const char* out = getenv("DZ_TRACE_OUT");
  FILE* f = fopen(out ? out : "dztrace.csv", "w");
  if (!f) {
    fprintf(stderr, "[dztrace] cannot write %s\n", out ? out : "dztrace.csv");
    return;
  }
  std::lock_guard<std::mutex> lk(g_mu);
  fprintf(f, "kind,start_ns,end_ns,name\n");
  fprintf(f, "window,%llu,%llu,profiler start/stop\n", (unsigned long long)g_win0, (unsigned long long)g_win1);
  for (const Row& r : g_rows) {
    std::string n = r.name;
    for (char& c : n)
      if (c == ',' || c == '\n') c = ';';
    fprintf(f, "%s,%llu,%llu,%s\n", r.kind, (unsigned long long)r.t0, (unsigned long long)r.t1, n.c_str());
  }
  fclose(f);
  fprintf(stderr, "[dztrace] %zu records\n", g_rows.size());
}

void init() {
  CUPTI_OK(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed));
  CUPTI_OK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
  CUPTI_OK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY));
  CUPTI_OK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET));
  CUPTI_OK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME));
  CUPTI_OK(cuptiSubscribe(&g_sub, reinterpret_cast<CUpti_CallbackFunc>(on_api), nullptr));
  CUPTI_OK(cuptiEnableCallback(1, g_sub, CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStart_v4000));
  CUPTI_OK(cuptiEnableCallback(1, g_sub, CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStop_v4000));
  atexit(at_exit);
}

}  // namespace

extern "C" int InitializeInjection(void) {
  init();
  return 1;
}
