// The metrics of DESIGN.md §3 moved to balance/metrics.h (pure C++, shared with the pipeline
// simulator); this header keeps the old include path working.
#pragma once

#include "balance/metrics.h"
