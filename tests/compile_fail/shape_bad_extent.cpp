// EXPECT: every extent is a size (>= 0) or mpx::any
#include <mpx/shape.hpp>
#ifdef MPX_FAIL
using D = mpx::Dims<-2, 64>;
#else
using D = mpx::Dims<mpx::any, 64>;
#endif
static_assert(D::rank == 2);
