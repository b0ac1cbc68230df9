"""How many layers a case's model has of each sort, torch-free (the attention kinds' case lines read it):
NUM_LAYERS, the KV pool's (a softmax case's model; a hybrid model's full-attention layers) and a
recurrent case's linear layers but where a hybrid pattern says otherwise. The pool holds one more layer
before the case's own, so a backend that ignores layer_id reads poison and writes the wrong layer."""
NUM_LAYERS = 2
