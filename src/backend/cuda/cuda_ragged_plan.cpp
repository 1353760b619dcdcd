// The host plan of the CUDA stage's ragged forward (cuda_ragged_plan.h).
#include "backend/cuda/cuda_ragged_plan.h"

#include <algorithm>
#include <string>

#include "common/error.h"

namespace ppb::cuda {
namespace {

/// "row 3 (slot 2, pos 7, tokens 4)", for messages.
std::string row_text(const RaggedStep& s, size_t r) {
  return "row " + std::to_string(r) + " (slot " + std::to_string(s.slot[r]) + ", pos " + std::to_string(s.pos[r]) +
         ", tokens " + std::to_string(s.tokens[r]) + ")";
}

/// Builds the pieces of one chunk into a plan: PlanBuilder::chunk's state.
class PieceBuilder {
 public:
  PieceBuilder(RaggedPlan& p, const RaggedLimits& lim) : p_(p), lim_(lim) {}

  /// Adds sub-row `s` (within the current chunk) to the chunk's pieces.
  void add(RaggedSubRow s) {
    if (lim_.long_row_tokens > 0 && s.n > lim_.long_row_tokens) {
      flush();
      p_.subs.push_back(s);
      RaggedPiece pc;
      pc.t0 = s.t0;
      pc.tokens = s.n;
      pc.sub0 = static_cast<int>(p_.subs.size()) - 1;
      pc.subs = 1;
      pc.keys = s.pos + s.n;
      pc.prefill = true;
      p_.pieces.push_back(pc);
      return;
    }
    while (s.n > 0) {
      if (fits(open_tokens_ + s.n, std::max(open_keys_, s.pos + s.n))) {
        open(s);
        return;
      }
      if (!open_.empty()) {  // the open piece is full: close it, then try the sub-row alone
        flush();
        continue;
      }
      int m = s.n - 1;  // the sub-row alone does not fit: its longest head that does
      while (m > 0 && !fits(m, s.pos + m)) --m;
      if (m == 0) {
        throw InternalError("ragged step: one token at position " + std::to_string(s.pos) +
                            " needs more attention partials than the stage's " +
                            std::to_string(lim_.partial_capacity) + " floats");
      }
      RaggedSubRow head = s;
      head.n = m;
      open(head);
      flush();
      s.t0 += m;
      s.pos += m;
      s.n -= m;
    }
  }

  /// Closes the open ragged piece: its sub-rows and their device arrays into the plan.
  void flush() {
    if (open_.empty()) return;
    RaggedPiece pc;
    pc.t0 = open_.front().t0;
    pc.tokens = open_tokens_;
    pc.sub0 = static_cast<int>(p_.subs.size());
    pc.subs = static_cast<int>(open_.size());
    pc.keys = open_keys_;
    std::vector<int32_t>& m = p_.meta;
    pc.meta_slot = static_cast<int>(m.size());
    for (const RaggedSubRow& s : open_) m.push_back(s.slot);
    pc.meta_pos = static_cast<int>(m.size());
    for (const RaggedSubRow& s : open_) m.push_back(s.pos);
    pc.meta_offset = static_cast<int>(m.size());
    m.push_back(0);
    for (const RaggedSubRow& s : open_) m.push_back(m.back() + s.n);
    p_.subs.insert(p_.subs.end(), open_.begin(), open_.end());
    p_.pieces.push_back(pc);
    open_.clear();
    open_tokens_ = open_keys_ = 0;
  }

 private:
  bool fits(int tokens, int keys) const {
    if (tokens > lim_.max_piece_tokens) return false;
    return !lim_.partial_floats || lim_.partial_floats(tokens, keys) <= lim_.partial_capacity;
  }
  void open(const RaggedSubRow& s) {
    open_.push_back(s);
    open_tokens_ += s.n;
    open_keys_ = std::max(open_keys_, s.pos + s.n);
  }

  RaggedPlan& p_;
  const RaggedLimits& lim_;
  std::vector<RaggedSubRow> open_;  // the ragged piece being filled
  int open_tokens_ = 0, open_keys_ = 0;
};

}  // namespace

void check_ragged_step(const RaggedStep& step, int batch, int max_context) {
  const size_t rows = step.slot.size();
  if (step.pos.size() != rows || step.tokens.size() != rows) {
    throw InternalError("ragged step: slot, pos and tokens have " + std::to_string(rows) + ", " +
                        std::to_string(step.pos.size()) + " and " + std::to_string(step.tokens.size()) +
                        " entries (one per row each)");
  }
  if (rows < 1 || rows > static_cast<size_t>(batch)) {
    throw InternalError("ragged step: " + std::to_string(rows) + " rows, outside [1, " + std::to_string(batch) +
                        "] (the stage's batch)");
  }
  std::vector<int> row_of_slot(static_cast<size_t>(batch), -1);
  for (size_t r = 0; r < rows; ++r) {
    const int32_t slot = step.slot[r], pos = step.pos[r], n = step.tokens[r];
    if (slot < 0 || slot >= batch)
      throw InternalError("ragged step: " + row_text(step, r) + ": slot outside [0, " + std::to_string(batch) + ")");
    if (row_of_slot[slot] >= 0) {
      throw InternalError("ragged step: " + row_text(step, r) + ": slot " + std::to_string(slot) + " is also row " +
                          std::to_string(row_of_slot[slot]) + "'s");
    }
    row_of_slot[slot] = static_cast<int>(r);
    if (n < 1) throw InternalError("ragged step: " + row_text(step, r) + ": tokens must be >= 1");
    if (pos < 0 || static_cast<int64_t>(pos) + n > max_context) {
      throw InternalError("ragged step: " + row_text(step, r) + ": positions [pos, pos + tokens) outside [0, " +
                          std::to_string(max_context) + ") (the KV cache)");
    }
  }
}

RaggedPlan plan_ragged_step(const RaggedStep& step, const RaggedLimits& lim) {
  check_ragged_step(step, lim.batch, lim.max_context);
  if (lim.chunk_tokens < 1 || lim.max_piece_tokens < 1)
    throw InternalError("ragged plan: chunk_tokens and max_piece_tokens must be >= 1");
  RaggedPlan p;
  p.rows = step.rows();
  p.tokens = step.total_tokens();
  const size_t T = static_cast<size_t>(p.tokens);
  p.meta.resize(3 * T + static_cast<size_t>(p.rows));
  p.token_pos = 0;
  p.token_slot = p.tokens;
  p.token_row = 2 * p.tokens;
  p.last = 3 * p.tokens;
  std::vector<int> offset(static_cast<size_t>(p.rows) + 1, 0);
  for (int r = 0; r < p.rows; ++r) {
    offset[r + 1] = offset[r] + step.tokens[r];
    for (int t = 0; t < step.tokens[r]; ++t) {
      const size_t i = static_cast<size_t>(offset[r] + t);
      p.meta[p.token_pos + i] = step.pos[r] + t;
      p.meta[p.token_slot + i] = step.slot[r];
      p.meta[p.token_row + i] = r;
    }
    p.meta[p.last + r] = offset[r + 1] - 1;
  }
  PieceBuilder pieces(p, lim);
  for (int c0 = 0; c0 < p.tokens; c0 += lim.chunk_tokens) {
    RaggedChunk c;
    c.t0 = c0;
    c.tokens = std::min(lim.chunk_tokens, p.tokens - c0);
    c.piece0 = static_cast<int>(p.pieces.size());
    for (int r = 0; r < p.rows; ++r) {  // the rows' parts inside [c0, c0 + c.tokens)
      const int a = std::max(c0, offset[r]), b = std::min(c0 + c.tokens, offset[r + 1]);
      if (a < b) pieces.add({a, step.slot[r], step.pos[r] + (a - offset[r]), b - a});
    }
    pieces.flush();
    c.pieces = static_cast<int>(p.pieces.size()) - c.piece0;
    p.chunks.push_back(c);
  }
  return p;
}

size_t ragged_meta_ints(int batch, size_t max_tokens) {
  // Per token: pos, slot, row; per row: last. Every sub-row holds >= 1 token, every piece >= 1
  // sub-row: the pieces' slot, pos and offset arrays hold <= 3 x sub-rows + pieces <= 4 x tokens.
  return 7 * max_tokens + static_cast<size_t>(std::max(batch, 0));
}

}  // namespace ppb::cuda
