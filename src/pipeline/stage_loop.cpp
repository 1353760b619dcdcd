#include "pipeline/stage_loop.h"

#include <algorithm>
#include <sstream>
#include <utility>
#include <vector>

#include "backend/lane_abort.h"
#include "common/error.h"
#include "common/flight_recorder.h"

namespace ppb {

StageLoopBase::StageLoopBase(Device& device, Transport& transport, StageExecutor& stage, const StagePlacement& place,
                             const char* kind)
    : device_(device),
      transport_(transport),
      stage_(stage),
      place_(place),
      S(place.num_stages),
      first(place.stage == 0),
      last(place.stage == place.num_stages - 1),
      kind_(kind) {}

void StageLoopBase::connect_links(const std::vector<std::pair<int, int>>& extra) {
  const int me = place_.rank;
  std::vector<std::pair<int, int>> links = extra;
  if (place_.prev_rank >= 0) links.emplace_back(place_.prev_rank, me);
  for (int r : place_.next_ranks) links.emplace_back(me, r);
  if (S > 1 && first) links.emplace_back(place_.last_rank, me);  // the token return
  if (S > 1 && last)
    for (int r : place_.return_ranks) links.emplace_back(me, r);
  std::sort(links.begin(), links.end());
  links.erase(std::unique(links.begin(), links.end()), links.end());
  transport_.connect(links);
}

std::string StageLoopBase::describe_stage() const {
  std::ostringstream os;
  os << kind_ << " " << place_.stage << " (units " << stage_.first_unit() << ".." << stage_.last_unit() << ")";
  return os.str();
}

void StageLoopBase::abort_lanes_and_links() {
  request_lane_abort();
  transport_.abort();
}

void StageLoopBase::barrier(Lane& lane, const std::string& when) {
  transport_.enqueue_barrier(lane);
  drain({&lane}, when);
}

void StageLoopBase::drain(std::initializer_list<Lane*> lanes, const std::string& when) {
  try {
    for (Lane* l : lanes)
      if (l) l->synchronize();
  } catch (const std::exception& e) {
    abort_lanes_and_links();
    throw InternalError(describe_stage() + ", " + when + ": " + e.what());
  }
}

}  // namespace ppb
