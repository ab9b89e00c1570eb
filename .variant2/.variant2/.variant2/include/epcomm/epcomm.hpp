// The whole public C++ API of epcomm.
#pragma once

#include "epcomm/bootstrap.hpp"
#include "epcomm/buffer.hpp"
#include "epcomm/config.hpp"
#include "epcomm/error.hpp"
#include "epcomm/types.hpp"
