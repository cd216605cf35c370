#include "bench_linear_attn.cuh"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <string>
#include <vector>

#include "bench_util.cuh"
#include "common.cuh"
#include "linear_attn.cuh"

namespace dz::cuda {

namespace {

using namespace benchrand;

struct Row {
  std::string name, shape, extra;
  double ms;
};

}  // namespace

int bench_linear_attn(const std::string& json_out) {
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  std::vector<Row> rows;
  auto add = [&](const std::string& name, const std::string& shape, double ms, const std::string& extra) {
    rows.push_back({name, shape, extra, ms});
    std::printf("%-34s %-28s %10.4f ms  %s\n", name.c_str(), shape.c_str(), ms, extra.c_str());
    std::fflush(stdout);
  };
  char buf[256];
  // DZ_BENCH_ONLY=<substring> runs only the rows whose "<name> H=<heads>" or "<name> B=<batch>" contains it (for
  // profilers: scripts/ncu-targets.sh), e.g. "kda_chunk_serial H=32" or "gdn_chunk".
  const char* only = std::getenv("DZ_BENCH_ONLY");
  auto want = [&](const char* name, const char* dim, int n) {
    return !only || (std::string(name) + " " + dim + "=" + std::to_string(n)).find(only) != std::string::npos;
  };

  // ---- chunked prefill, B=1, T=65536, K=V=128: serial (one CTA per head) and the parallel scan ----
  const int T = 65536, K = 128, V = 128;
  for (int H : {32, 8, 4}) {
    const size_t TH = size_t(T) * H;
    bf16 *q = rand_bf16(TH * K, 1), *k = rand_bf16(TH * K, 2), *v = rand_bf16(TH * V, 3), *b = rand_bf16(TH, 4);
    bf16 *f = rand_bf16(TH * K, 5, -3.f, 1.f), *fg = rand_bf16(TH, 6, -3.f, 1.f), *o = alloc<bf16>(TH * V);
    float *A_log = rand_f32(size_t(H), 7, -0.5f, 0.5f), *dtb = rand_f32(size_t(H) * K, 8, -0.1f, 0.1f);
    float* ht = alloc<float>(size_t(H) * K * V);
    int32_t* cu = alloc<int32_t>(2);
    const int32_t cuh[2] = {0, T};
    CUDA_CHECK(cudaMemcpy(cu, cuh, sizeof cuh, cudaMemcpyHostToDevice));
    // the scan's segments: the backend's automatic rule where it takes the scan (H <= 8 on 132 SMs),
    // else ceil(SMs / H) as before it (H = 32: 5)
    LaPrefill rule;
    rule.HK = rule.HV = H, rule.K = K, rule.V = V, rule.N = 1, rule.T_total = T;
    const int auto_segs = la_scan_segments(rule);
    const int segs = auto_segs > 1 ? auto_segs : std::max(1, std::min(64, (sms + H - 1) / H));
    // where the rule takes the scan, also half and twice its segments (<= 64): whether the rule's
    // count is the best one on this card
    std::vector<int> scan_segs = {segs};
    if (auto_segs > 1) {
      if (segs / 2 > 1) scan_segs.push_back(segs / 2);
      if (std::min(64, 2 * segs) > segs) scan_segs.push_back(std::min(64, 2 * segs));
    }
    void* ws = alloc<char>(la_scan_workspace_bytes(T, *std::max_element(scan_segs.begin(), scan_segs.end()), H, K, V));
    void* pws = alloc<char>(la_prefill_workspace_bytes(T, 1, H, K, V));
    LaPrefill p;
    p.q = q, p.k = k, p.v = v, p.b = b, p.HK = H, p.HV = H, p.K = K, p.V = V, p.scale = 0.088388f;
    p.cu_seqlens = cu, p.N = 1, p.ht = ht, p.o = o, p.T_total = T;
    p.scan_segments = 1;  // the serial and pipelined rows as they are (the scan has rows of its own)
    const double bytes = double(TH) * (2 * K + V + 1) * 2 + double(TH) * V * 2;  // inputs + o, bf16
    for (bool kda : {true, false}) {
      const bool serial = want(kda ? "kda_chunk_serial" : "gdn_chunk_serial", "H", H);
      const bool scan = want(kda ? "kda_chunk_parallel_scan" : "gdn_chunk_parallel_scan", "H", H);
      const bool piped = want(kda ? "kda_chunk_pipelined" : "gdn_chunk_pipelined", "H", H);
      if (!serial && !scan && !piped) continue;
      p.kda = kda;
      p.gate = {kda ? f : fg, A_log, dtb, 0.f};
      const double gb = (bytes + (kda ? double(TH) * K * 2 : 0.0)) / 1e9;
      std::snprintf(buf, sizeof buf, "B=1 T=%d H=%d K=%d V=%d", T, H, K, V);
      // serial scan: the key side of all chunks in parallel, then one sequence of chunks per
      // (head, 64 state columns: the wgmma recurrence at K = 128), outputs inside the recurrence or
      // in a pass after it; the earlier versions: docs/perf/ and kernels/dev/linear_attn/.
      double ms_s = 1e30;
      for (int fused : {1, 0}) {
        if (!serial) break;
        p.fused_output = fused;
        p.workspace = pws;
        const double ms = median_ms([&] { la_chunk_prefill(p, nullptr); }, 3, 1);
        ms_s = std::min(ms_s, ms);
        std::snprintf(buf + 128, 128, "v4 wgmma%s (%d CTAs), %.0f GB/s", fused ? " fused" : " out-pass",
                      H * (V / 64), gb / (ms * 1e-3));
        add(kda ? "kda_chunk_serial" : "gdn_chunk_serial", buf, ms, buf + 128);
      }
      p.fused_output = -1;  // the default
      // pipelined: a segment's prep beside the previous segment's recurrence on a second stream
      // (automatic segments, as the backend runs it, 4 and 16); bitwise the serial result. The _prio rows:
      // the same with the recurrence's stream at the greatest priority (not what the backend runs)
      if (piped) {
        for (bool prio : {false, true}) {
          LaSide side;
          side.create(prio);
          p.side = &side;
          p.workspace = pws;
          for (int segs_p : {0, 4, 16}) {
            p.pipeline_segments = segs_p;
            const int S = la_pipeline_segments(p);
            if (S <= 1) continue;
            const double ms = median_ms([&] { la_chunk_prefill(p, nullptr); }, 5, 1);
            std::snprintf(buf + 128, 128, "v4 pipelined, %d segments%s%s, %.2fx best serial, %.0f GB/s", S,
                          segs_p ? "" : " (automatic)", prio ? ", recurrence stream at top priority" : "",
                          serial ? ms_s / ms : 0.0, gb / (ms * 1e-3));
            const char* name = kda ? (prio ? "kda_chunk_pipelined_prio" : "kda_chunk_pipelined")
                                   : (prio ? "gdn_chunk_pipelined_prio" : "gdn_chunk_pipelined");
            add(name, buf, ms, buf + 128);
          }
          CUDA_CHECK(cudaDeviceSynchronize());
        }
        p.side = nullptr;
        p.pipeline_segments = 0;
      }
      p.workspace = nullptr;
      if (!scan) continue;
      for (const int sg : scan_segs) {
        const double ms_p = median_ms([&] { la_parallel_prefill(p, T, sg, ws, nullptr); }, 5, 1);
        if (serial)
          std::snprintf(buf + 128, 128, "v4 segments=%d%s, %.2fx best serial, %.0f GB/s", sg,
                        sg == auto_segs ? " (automatic)" : "", ms_s / ms_p, gb / (ms_p * 1e-3));
        else
          std::snprintf(buf + 128, 128, "v4 segments=%d%s, %.0f GB/s", sg, sg == auto_segs ? " (automatic)" : "",
                        gb / (ms_p * 1e-3));
        add(kda ? "kda_chunk_parallel_scan" : "gdn_chunk_parallel_scan", buf, ms_p, buf + 128);
      }
    }
    for (void* ptr : {(void*)q, (void*)k, (void*)v, (void*)b, (void*)f, (void*)fg, (void*)o, (void*)A_log,
                      (void*)dtb, (void*)ht, (void*)cu, ws, pws})
      cudaFree(ptr);
  }

  // ---- recurrent decode: B=256 (bandwidth on state bytes) and B=1 single layer in a CUDA graph ----
  for (int B : {256, 1}) {
    if (!want(B == 256 ? "kda_decode" : "kda_decode_step_graph", "B", B)) continue;
    const int H = 32, layers = B == 1 ? 64 : 1;  // B=1: 64 layers' states (128 MB) so L2 does not hold them
    const size_t BH = size_t(B) * H;
    bf16 *q = rand_bf16(BH * K, 11), *k = rand_bf16(BH * K, 12), *v = rand_bf16(BH * V, 13), *b = rand_bf16(BH, 14);
    bf16 *f = rand_bf16(BH * K, 15, -3.f, 1.f), *o = alloc<bf16>(BH * V);
    float *A_log = rand_f32(size_t(H), 16, -0.5f, 0.5f), *dtb = rand_f32(size_t(H) * K, 17, -0.1f, 0.1f);
    float* st = rand_f32(size_t(layers) * BH * K * V, 18, -0.3f, 0.3f);
    std::vector<int32_t> sh(static_cast<size_t>(B));
    for (int i = 0; i < B; ++i) sh[size_t(i)] = (i * 37) % B;  // permuted slots
    int32_t* slot = alloc<int32_t>(size_t(B));
    CUDA_CHECK(cudaMemcpy(slot, sh.data(), sh.size() * 4, cudaMemcpyHostToDevice));
    LaDecode p;
    p.q = q, p.k = k, p.v = v, p.b = b, p.gate = {f, A_log, dtb, 0.f};
    p.HK = H, p.HV = H, p.K = K, p.V = V, p.scale = 0.088388f, p.B = B, p.slot = slot, p.o = o;
    const double state_bytes = 2.0 * BH * K * V * 4;  // read + write
    std::snprintf(buf, sizeof buf, "B=%d H=%d K=%d V=%d", B, H, K, V);
    if (B == 256) {
      p.states = st;
      for (int bv : {128, 64, 32}) {
        p.value_block = bv;
        const double ms = median_ms([&] { la_decode(p, nullptr); }, 20, 3);
        std::snprintf(buf + 128, 128, "BV=%d, %.0f GB/s on state bytes (read+write)", bv,
                      state_bytes / (ms * 1e-3) / 1e9);
        add("kda_decode", buf, ms, buf + 128);
      }
      p.value_block = 0;
    } else for (int bv : {128, 32}) {
      p.value_block = bv;
      cudaStream_t s;
      CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      cudaGraph_t g;
      cudaGraphExec_t ge;
      CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
      for (int l = 0; l < layers; ++l) {
        p.states = st + size_t(l) * BH * K * V;
        la_decode(p, s);
      }
      CUDA_CHECK(cudaStreamEndCapture(s, &g));
      CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
      const double ms = median_ms([&] { CUDA_CHECK(cudaGraphLaunch(ge, nullptr)); }, 20, 3) / layers;
      std::snprintf(buf + 128, 128, "BV=%d, per layer step, graph of %d layer steps", bv, layers);
      add("kda_decode_step_graph", buf, ms, buf + 128);
      cudaGraphExecDestroy(ge);
      cudaGraphDestroy(g);
      cudaStreamDestroy(s);
      p.value_block = 0;
    }
    for (void* ptr : {(void*)q, (void*)k, (void*)v, (void*)b, (void*)f, (void*)o, (void*)A_log, (void*)dtb, (void*)st,
                      (void*)slot})
      cudaFree(ptr);
  }
  CUDA_CHECK(cudaDeviceSynchronize());

  std::vector<std::string> res;
  for (const Row& r : rows)
    res.push_back("{\"name\": \"" + r.name + "\", \"impl\": \"dayzero\", \"shape\": \"" + r.shape +
                  "\", \"ms\": " + std::to_string(r.ms) + ", \"note\": \"" + r.extra + "\"}");
  return write_bench_report("linear-attn", res, json_out, false);
}

}  // namespace dz::cuda
