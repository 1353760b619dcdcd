// GPU ceilings and a one-layer / head profile against their floors (scripts/gpu_check.sh).
//
//   ppb_gpu_bench --model inputs/models/llama-3.1-8b.json [--dtype bf16] [--prompt 2048]
//                 [--batch 8] [--context 2048] [--iters 20] [--unit 1] [--only CASE] [--out FILE] [--nccl]
//
// --nccl (two GPUs): NCCL send/recv and all-reduce sweeps 8 B .. 256 MiB between the first two
// GPUs after the table (gpu_nccl_bench.h), in nccl-tests' columns; with fewer GPUs it stops at
// once with status 2 and says so.
//
// Ceilings measured in the same run: a large device-to-device copy (bytes read + written per
// second) and a large bf16 cuBLAS GEMM (dense TFLOP/s). Each case of the CUDA stage is then
// printed against its floor: memory floor = bytes read (weights + KV, model::unit_bytes_moved)
// / copy bandwidth; compute floor = FLOPs (model::unit_flops) / GEMM rate; floor = the larger.
// "% of floor" = floor / measured (100% = at the ceiling). The layer rows are also judged
// against issue 3's targets (decode: weights + KV bytes / copy bandwidth >= 70% of the time;
// prefill: FLOPs / GEMM rate >= 50% of the time), PASS/FAIL in the last column and on the
// closing "targets:" line, where the layer is a dense one with standard attention; a layer of
// experts (--model qwen3-30b-a3b.json) or of latent attention (deepseek-v3.json --unit 4: MLA
// and 256 experts) is printed against its floor alone (the floors count the experts its tokens
// reach, model::unit_bytes_moved). --unit picks the layer (default 1, the first). --only
// "layer decode" (a case's first two words) times that case alone: for a kernel profiler
// (scripts/gpu_kernels.sh runs Nsight Compute over it). Writes key=value lines to --out for the PyTorch comparison
// (scripts/torch_layer.py).
#include <cublas_v2.h>
#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_lane.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_raii.h"
#include "backend/device.h"
#include "backend/lane_hold.h"
#include "gpu_nccl_bench.h"
#include "model/model_spec.h"

namespace {

using namespace ppb;

struct Args {
  std::string model = "inputs/models/llama-3.1-8b.json";
  std::string dtype = "bf16";
  std::string out;
  int prompt = 2048, batch = 8, context = 2048, iters = 20;
  int unit = 1;  ///< the layer unit profiled (1: the first layer)
  std::string only;  ///< "" = every case; else the case whose name starts with it
  bool nccl = false;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--nccl") {
      a.nccl = true;
      --i;  // a flag: no value
      continue;
    }
    if (i + 1 >= argc) throw UserError("option " + k + " needs a value");
    const std::string v = argv[i + 1];
    if (k == "--model") a.model = v;
    else if (k == "--dtype") a.dtype = v;
    else if (k == "--out") a.out = v;
    else if (k == "--prompt") a.prompt = std::atoi(v.c_str());
    else if (k == "--batch") a.batch = std::atoi(v.c_str());
    else if (k == "--context") a.context = std::atoi(v.c_str());
    else if (k == "--iters") a.iters = std::atoi(v.c_str());
    else if (k == "--unit") a.unit = std::atoi(v.c_str());
    else if (k == "--only") a.only = v;
    else throw UserError("unknown option " + k);
  }
  return a;
}

/// Median milliseconds of `fn` enqueued on `lane`, timed by events around each call, with the
/// lane held until the call is fully enqueued (backend/lane_hold.h: the GPU's work alone, not
/// the host's launch gaps) when `hold`: only for at most kMaxHeldLaunches launches.
/// With --only: the timed forwards (not the ceilings, not the warm-up) between
/// cudaProfilerStart/Stop, for `ncu --profile-from-start off` (scripts/gpu_kernels.sh).
bool g_profile_range = false;

template <typename Fn>
double time_ms(cuda::CudaLane& lane, int warmup, int iters, Fn fn, bool hold = true) {
  const cudaStream_t stream = lane.stream();
  for (int i = 0; i < warmup; ++i) fn();
  lane.synchronize();
  // A kernel profiler runs each launch to completion before the launch returns: a held lane
  // would wait for the very call that releases it. Unheld under one.
  if (g_profile_range) {
    hold = false;
    CUDA_CHECK(cudaProfilerStart());
  }
  std::vector<double> ms;
  cuda::EventHandle a, b;
  for (int i = 0; i < iters; ++i) {
    auto timed = [&] {
      CUDA_CHECK(cudaEventRecord(a.get(), stream));
      fn();
      CUDA_CHECK(cudaEventRecord(b.get(), stream));
    };
    if (hold)
      enqueue_held(lane, timed);
    else
      timed();
    CUDA_CHECK(cudaEventSynchronize(b.get()));
    float t = 0;
    CUDA_CHECK(cudaEventElapsedTime(&t, a.get(), b.get()));
    ms.push_back(t);
  }
  if (g_profile_range) CUDA_CHECK(cudaProfilerStop());
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args a = parse(argc, argv);
    g_profile_range = !a.only.empty();
    if (a.nccl && cuda_visible_device_count() < 2) return bench::run_nccl_sweeps(0, 0);  // says why, status 2
    if (cuda_visible_device_count() <= 0) {
      std::fprintf(stderr, "no CUDA device visible: %s\n", cuda_unavailable_reason().c_str());
      return 3;
    }
    auto dev = create_cuda_device(0);
    const DType dt = parse_dtype(a.dtype);
    const model::ModelSpec m = model::load_model_config(a.model);
    auto lane_owner = dev->create_lane("bench");
    cuda::CudaLane& lane = cuda::as_cuda_lane(*lane_owner);
    const cudaStream_t st = lane.stream();
    std::printf("device: %s (%s), model %s, dtype %s\n", dev->name().c_str(), dev->bus_id().c_str(), a.model.c_str(),
                dtype_name(dt).c_str());

    // ---- ceilings -------------------------------------------------------------------------
    // The device's own ceilings (Device::measure_*), the ones every run stores in /ranks.
    const double copy_gbs = dev->measure_read_bandwidth_GBps();
    const double gemm_tflops = dev->measure_gemm_gflops(dt) / 1e3;
    std::printf("\nceilings: D2D copy %.0f GB/s (read+write), %s GEMM 8192^3 %.0f TFLOP/s\n", copy_gbs,
                dtype_name(dt).c_str(), gemm_tflops);

    // ---- one layer and the head -----------------------------------------------------------------
    struct Case {
      std::string name;
      int unit;
      model::Phase phase;
      int batch, tokens, pos;
    };
    const int layer_unit = a.unit, head_unit = m.num_units() - 1;
    if (layer_unit < 1 || layer_unit >= head_unit)
      throw UserError("--unit " + std::to_string(layer_unit) + ": a layer of this model is 1.." + std::to_string(head_unit - 1));
    const model::LayerShape& layer = m.layer_of(layer_unit);
    const bool standard_layer = !layer.is_moe() && !layer.is_mla();
    std::printf("layer unit %d: %s%s\n", layer_unit, layer.is_moe() ? "mixture of experts" : "dense MLP",
                layer.is_mla() ? ", latent attention (MLA)" : "");
    const std::vector<Case> cases = {
        {"layer prefill B=1 T=" + std::to_string(a.prompt), layer_unit, model::Phase::prefill, 1, a.prompt, 0},
        {"layer decode B=" + std::to_string(a.batch) + " ctx=" + std::to_string(a.context), layer_unit,
         model::Phase::decode, a.batch, 1, a.context},
        {"head prefill B=1 T=" + std::to_string(a.prompt), head_unit, model::Phase::prefill, 1, a.prompt, 0},
        {"head decode B=" + std::to_string(a.batch), head_unit, model::Phase::decode, a.batch, 1, a.context},
    };
    std::printf("\n%-30s %10s %10s %10s %10s %8s %8s  %s\n", "case", "ms", "mem floor", "flop floor", "TFLOP/s",
                "GB/s", "% floor", "target (issue 3)");
    std::ofstream out;
    if (!a.out.empty()) out.open(a.out);
    out << "copy_gbs=" << copy_gbs << "\ngemm_tflops=" << gemm_tflops << "\n";
    std::string verdicts;
    for (const Case& c : cases) {
      if (!a.only.empty() && c.name.rfind(a.only, 0) != 0) continue;
      StageConfig cfg;
      cfg.work.batch = c.batch;
      // KV capacity P + G = max(prompt, context + 1): room for the prefill and the decode case.
      cfg.work.prompt_len = a.prompt;
      cfg.work.gen_len = std::max(0, a.context + 1 - a.prompt);
      cfg.work.dtype = dt;
      cfg.work.seed = 1;
      auto stage = dev->create_stage(m, c.unit, c.unit, cfg);
      auto in = dev->allocate(stage->input_bytes(c.tokens));
      auto o = dev->allocate(stage->output_bytes(c.tokens));
      cuda::fill_uniform(in->data(), dt, in->bytes() / dtype_bytes(dt), 3, 1.0f, 0.0f, st);
      const size_t launches = stage->launches_per_forward(c.tokens);
      const double ms = time_ms(
          lane, 3, a.iters, [&] { stage->enqueue_forward(lane, in->data(), o->data(), 0, c.pos, c.tokens); },
          launches <= kMaxHeldLaunches);
      std::printf("  (%s: %zu launches per forward, %s)\n", c.name.c_str(), launches,
                  launches <= kMaxHeldLaunches ? "held" : "not held: device-bound");
      lane.synchronize();
      const int ctx = c.pos + c.tokens;
      const double flops = model::unit_flops(m, c.unit, c.phase, c.batch, c.tokens, ctx);
      const double bytes = model::unit_bytes_moved(m, c.unit, c.phase, c.batch, c.tokens, ctx, dtype_bytes(dt));
      const double mem_ms = bytes / (copy_gbs * 1e9) * 1e3, flop_ms = flops / (gemm_tflops * 1e12) * 1e3;
      const double floor_ms = std::max(mem_ms, flop_ms);
      std::string key = c.name.substr(0, c.name.find(' ')) + "_" + (c.phase == model::Phase::prefill ? "prefill" : "decode");
      // Issue 3's targets, for the layer: decode moves its bytes at >= 70% of the copy
      // bandwidth (mem floor / ms), prefill runs its FLOPs at >= 50% of the GEMM rate.
      std::string target = "-";
      if (c.unit == layer_unit && standard_layer) {
        const bool decode = c.phase == model::Phase::decode;
        const double frac = (decode ? mem_ms : flop_ms) / ms, need = decode ? 0.70 : 0.50;
        char buf[96];
        std::snprintf(buf, sizeof buf, "%s %.0f%% of %s (need >= %.0f%%)", frac >= need ? "PASS" : "FAIL", 100.0 * frac,
                      decode ? "copy BW" : "GEMM rate", 100.0 * need);
        target = buf;
        verdicts += std::string(verdicts.empty() ? "" : ", ") + key + " " + (frac >= need ? "PASS" : "FAIL");
        out << key << "_target_frac=" << frac << "\n";
      }
      std::printf("%-30s %10.3f %10.3f %10.3f %10.1f %8.0f %7.0f%%  %s\n", c.name.c_str(), ms, mem_ms, flop_ms,
                  flops / (ms * 1e-3) / 1e12, bytes / (ms * 1e-3) / 1e9, 100.0 * floor_ms / ms, target.c_str());
      out << key << "_ms=" << ms << "\n" << key << "_floor_ms=" << floor_ms << "\n";
    }
    if (standard_layer)
      std::printf("\ntargets (issue 3, one %s layer): %s; and not slower than PyTorch eager (scripts/torch_layer.py)\n",
                  dtype_name(dt).c_str(), verdicts.c_str());
    return a.nccl ? bench::run_nccl_sweeps(5, a.iters) : 0;
  } catch (const UserError& e) {
    std::fprintf(stderr, "ppb_gpu_bench: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ppb_gpu_bench: %s\n", e.what());
    return 1;
  }
}
