// EXPECT: module must declare hidden_type
#include "../support/archetypes.hpp"
using namespace archetypes;
#ifdef MPX_FAIL
using S = mpx::Stage<Vision, mpx::CPU<0>, mpx::Layers<0, 2>>;
#else
using S = mpx::Stage<Text, mpx::CPU<0>, mpx::Layers<0, 2>>;
#endif
static_assert(S::has_layers);
