"""Language-model pretraining pieces of ``softargmax reproduce lm``: the decoder, the data, the metrics and the
gradient with respect to a learned reference measure."""
