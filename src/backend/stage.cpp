#include "backend/stage.h"

#include <string>
#include <vector>

#include "common/error.h"

namespace ppb {

void check_stage_layer(const model::LayerShape& s, int hidden, int layer) {
  const bool attn_ok = s.is_mla() ? s.mla.qk_nope >= 1 && s.mla.qk_rope >= 2 && s.mla.qk_rope % 2 == 0 &&
                                        s.mla.v_head_dim >= 1 && s.mla.q_lora_rank >= 0
                                  : s.n_kv_heads >= 1 && s.n_heads % s.n_kv_heads == 0 && s.head_dim >= 2 &&
                                        s.head_dim % 2 == 0;
  const bool mlp_ok = s.is_moe() ? s.moe.top_k >= 1 && s.moe.top_k <= s.moe.n_experts &&
                                       s.moe.expert_intermediate >= 1 && s.intermediate >= 0
                                 : s.intermediate >= 1;
  if (s.hidden != hidden || s.n_heads < 1 || !attn_ok || !mlp_ok) {
    throw UserError("layer " + std::to_string(layer) + " has an inconsistent shape: hidden=" + std::to_string(s.hidden) +
                    " n_heads=" + std::to_string(s.n_heads) + " n_kv_heads=" + std::to_string(s.n_kv_heads) +
                    " head_dim=" + std::to_string(s.head_dim) + " intermediate=" + std::to_string(s.intermediate) +
                    " experts=" + std::to_string(s.moe.n_experts) + " top_k=" + std::to_string(s.moe.top_k) +
                    " (need n_kv_heads | n_heads, an even head_dim or MLA rope dim, hidden = model hidden, "
                    "1 <= top_k <= experts)");
  }
}

void check_ragged_step(const RaggedStep& step, int group, const Workload& work) {
  const int B = work.batch, ctx = work.max_context(), rows = step.rows();
  const std::string what = "ragged step of group " + std::to_string(group) + " (" + std::to_string(rows) + " rows)";
  if (group < 0 || group >= work.groups)
    throw InternalError(what + ": the group is outside the stage's [0, " + std::to_string(work.groups) + ")");
  if (step.pos.size() != step.slot.size() || step.tokens.size() != step.slot.size())
    throw InternalError(what + ": slot, pos and tokens have " + std::to_string(step.slot.size()) + ", " +
                        std::to_string(step.pos.size()) + " and " + std::to_string(step.tokens.size()) + " entries");
  if (rows < 1 || rows > B)
    throw InternalError(what + ": a step has 1 to B = " + std::to_string(B) + " rows");
  std::vector<int> row_of_slot(B, -1);
  for (int r = 0; r < rows; ++r) {
    const int32_t slot = step.slot[r], pos = step.pos[r], n = step.tokens[r];
    const std::string row = what + ", row " + std::to_string(r) + " (slot " + std::to_string(slot) + ", pos " +
                            std::to_string(pos) + ", tokens " + std::to_string(n) + "): ";
    if (slot < 0 || slot >= B) throw InternalError(row + "the slot is outside [0, " + std::to_string(B) + ")");
    if (row_of_slot[slot] >= 0)
      throw InternalError(row + "row " + std::to_string(row_of_slot[slot]) + " has the same slot");
    row_of_slot[slot] = r;
    if (n < 1) throw InternalError(row + "a row has at least one new token");
    if (pos < 0 || static_cast<long>(pos) + n > ctx)
      throw InternalError(row + "positions outside the cache's [0, " + std::to_string(ctx) + ")");
  }
  std::vector<char> released(B, 0);
  for (const int32_t slot : step.released) {
    if (slot < 0 || slot >= B || released[slot])
      throw InternalError(what + ": released slot " + std::to_string(slot) + " outside [0, " + std::to_string(B) +
                          ") or given twice");
    released[slot] = 1;
  }
}

}  // namespace ppb
