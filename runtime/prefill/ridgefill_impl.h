/* Internal: RidgeFill map state shared by the prefill plan and the layer loop. */
#pragma once
#include "session_impl.h"
