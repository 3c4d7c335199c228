"""Scale-out of the model: the device mesh and sharding rules (`sharding`), the sharded forward and
train state (`sharded`), context-parallel attention (`cp_attention`), expert-parallel MoE dispatch
(`ep_moe`, `ep_ragged`), sequence packing/balancing (`packing`) and compiled-collective statistics
(`comm_stats`)."""
