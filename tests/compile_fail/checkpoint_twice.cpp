// EXPECT: mpx::Checkpointed (the whole stage) and mpx::CheckpointBlocks (each block) exclude each
#include "../support/archetypes.hpp"
using namespace archetypes;
#ifdef MPX_FAIL
using S = mpx::Stage<Text, mpx::GPU<1>, mpx::Checkpointed, mpx::CheckpointBlocks>;
#else
using S = mpx::Stage<Text, mpx::GPU<1>, mpx::CheckpointBlocks>;
#endif
static_assert(S::checkpoint_blocks);
