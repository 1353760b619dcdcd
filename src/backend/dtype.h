// The element types moved to common/dtype.h (the workload, the balancer and the backends share
// them); this header stays for the backends' includes.
#pragma once

#include "common/dtype.h"
