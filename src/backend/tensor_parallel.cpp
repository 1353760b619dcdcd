#include "backend/tensor_parallel.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "common/error.h"
#include "model/model_spec.h"

namespace ppb {

std::pair<size_t, size_t> tp_range(size_t n, int t, int r) {
  if (t < 1 || r < 0 || r >= t)
    throw InternalError("tp_range: rank " + std::to_string(r) + " is outside a group of width " + std::to_string(t));
  const size_t T = static_cast<size_t>(t), R = static_cast<size_t>(r);
  const size_t base = n / T, extra = n % T;
  const size_t begin = R * base + std::min(R, extra);
  return {begin, begin + base + (R < extra ? 1 : 0)};
}

void TpGroup::enqueue_allreduce_sum(void*, size_t, DType, void*) {
  throw InternalError("a GPU stage was given a host tensor-parallel group (MPI or threads); it needs the NCCL group");
}

void TpGroup::enqueue_allgather(const void*, void*, size_t, void*) {
  throw InternalError("a GPU stage was given a host tensor-parallel group (MPI or threads); it needs the NCCL group");
}

void tp_sum_in_rank_order(float* out, const float* const* parts, int t, size_t n) {
  if (out != parts[0])
    for (size_t i = 0; i < n; ++i) out[i] = parts[0][i];
  for (int r = 1; r < t; ++r) {
    const float* p = parts[r];
    for (size_t i = 0; i < n; ++i) out[i] += p[i];
  }
}

void tp_argmax_in_rank_order(float* value, int32_t* id, const float* const* values, const int32_t* const* ids, int t,
                             int rows) {
  for (int i = 0; i < rows; ++i) {
    float best = values[0][i];
    int32_t best_id = ids[0][i];
    for (int r = 1; r < t; ++r) {
      const float v = values[r][i];
      const int32_t k = ids[r][i];
      // argmax_rows' order: a NaN never wins (a NaN best loses to any number), a larger value
      // wins, ties go to the lower id.
      if (std::isnan(v)) continue;
      if (std::isnan(best) || v > best || (v == best && k < best_id)) {
        best = v;
        best_id = k;
      }
    }
    value[i] = best;
    id[i] = best_id;
  }
}

class ThreadTpGroups::Member final : public TpGroup {
 public:
  Member(ThreadTpGroups& all, int rank) : all_(all), rank_(rank) {}
  int width() const override { return all_.width_; }
  int rank() const override { return rank_; }

  void allreduce_sum(float* data, size_t n) override {
    // Publish, wait for every part, sum privately in rank order, wait until every rank has read
    // every part, then overwrite the own part.
    all_.slot_a_[rank_] = data;
    all_.arrive_and_wait();
    sum_.resize(n);
    std::vector<const float*> parts(all_.width_);
    for (int r = 0; r < all_.width_; ++r) parts[r] = static_cast<const float*>(all_.slot_a_[r]);
    tp_sum_in_rank_order(sum_.data(), parts.data(), all_.width_, n);
    all_.arrive_and_wait();
    std::copy(sum_.begin(), sum_.end(), data);
  }

  void allreduce_argmax(float* value, int32_t* id, int rows) override {
    all_.slot_a_[rank_] = value;
    all_.slot_b_[rank_] = id;
    all_.arrive_and_wait();
    std::vector<const float*> values(all_.width_);
    std::vector<const int32_t*> ids(all_.width_);
    for (int r = 0; r < all_.width_; ++r) {
      values[r] = static_cast<const float*>(all_.slot_a_[r]);
      ids[r] = static_cast<const int32_t*>(all_.slot_b_[r]);
    }
    std::vector<float> v(rows);
    std::vector<int32_t> k(rows);
    tp_argmax_in_rank_order(v.data(), k.data(), values.data(), ids.data(), all_.width_, rows);
    all_.arrive_and_wait();
    std::copy(v.begin(), v.end(), value);
    std::copy(k.begin(), k.end(), id);
  }

 private:
  ThreadTpGroups& all_;
  int rank_;
  std::vector<float> sum_;
};

ThreadTpGroups::ThreadTpGroups(int width) : width_(width), slot_a_(width), slot_b_(width) {
  if (width < 1) throw InternalError("ThreadTpGroups: width " + std::to_string(width) + " < 1");
  for (int r = 0; r < width; ++r) members_.push_back(std::make_unique<Member>(*this, r));
}

ThreadTpGroups::~ThreadTpGroups() = default;

TpGroup& ThreadTpGroups::group(int r) { return *members_.at(static_cast<size_t>(r)); }

void ThreadTpGroups::arrive_and_wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  const long gen = generation_;
  if (++arrived_ == width_) {
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
    return;
  }
  cv_.wait(lock, [&] { return generation_ != gen; });
}

namespace {

std::string widths_that_work(int n_heads, int n_kv) {
  std::string ok;
  for (int t = 1; t <= n_heads; ++t) {
    if (n_heads % t != 0 || (n_kv % t != 0 && t % n_kv != 0)) continue;
    ok += (ok.empty() ? "" : ", ") + std::to_string(t);
  }
  return ok;
}

}  // namespace

TpHeads tp_heads(int n_heads, int n_kv, int t, int r) {
  if (n_heads < 1 || n_kv < 1 || n_heads % n_kv != 0)
    throw UserError("a layer has " + std::to_string(n_heads) + " query heads and " + std::to_string(n_kv) +
                    " KV heads (need n_kv_heads | n_heads)");
  if (t < 1 || n_heads % t != 0 || (n_kv % t != 0 && t % n_kv != 0))
    throw UserError("tensor-parallel width " + std::to_string(t) + " cannot split " + std::to_string(n_heads) +
                    " query heads and " + std::to_string(n_kv) + " KV heads (the query heads must divide evenly, "
                    "the KV heads divide evenly or be replicated); widths that work: " + widths_that_work(n_heads, n_kv));
  if (r < 0 || r >= t) throw InternalError("tp_heads: rank " + std::to_string(r) + " outside width " + std::to_string(t));
  TpHeads h;
  h.q_count = n_heads / t;
  h.q_begin = r * h.q_count;
  if (n_kv % t == 0) {
    h.kv_count = n_kv / t;
    h.kv_begin = r * h.kv_count;
  } else {  // t % n_kv == 0: the one KV head this rank's query heads read (group n_heads / n_kv)
    h.kv_count = 1;
    h.kv_begin = h.q_begin / (n_heads / n_kv);
  }
  return h;
}

std::string tp_unsupported_reason(const model::ModelSpec& m, int t) {
  if (t < 1) return "a tensor-parallel width must be >= 1, got " + std::to_string(t);
  if (t == 1) return "";
  if (m.mtp) return "the multi-token-prediction modules (--mtp) run on one rank only";
  if (m.vocab < t) return "the vocabulary (" + std::to_string(m.vocab) + ") has fewer tokens than ranks";
  for (size_t l = 0; l < m.layers.size(); ++l) {
    const model::LayerShape& s = m.layers[l];
    if (s.is_mla())
      return "layer " + std::to_string(l) + " of " + m.architecture +
             " uses multi-head latent attention, which tensor parallelism does not split yet";
    if (s.is_moe())
      return "layer " + std::to_string(l) + " of " + m.architecture +
             " is a mixture-of-experts layer; tensor parallelism splits dense layers only (neither tensor nor "
             "expert parallelism of the experts is built)";
    if (s.attn_sinks)
      return "layer " + std::to_string(l) + " of " + m.architecture +
             " has attention sinks (gpt-oss), which tensor parallelism does not split yet";
    if (s.intermediate < t)
      return "layer " + std::to_string(l) + "'s MLP (intermediate " + std::to_string(s.intermediate) +
             ") is narrower than the group";
    try {
      tp_heads(s.n_heads, s.n_kv_heads, t, 0);
    } catch (const UserError& e) {
      return "layer " + std::to_string(l) + ": " + e.what();
    }
  }
  return "";
}

}  // namespace ppb
