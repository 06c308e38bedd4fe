"""pipelib.hf: a Hugging Face `transformers` model and tokenizer under pipelib (chapter 19).

- `llama`: a Llama-architecture causal LM built from a config of the tiny GPT's sizes (nothing
  downloaded), its layers in the order they run (embedding, decoder layers, norm and head) for
  the pipeline's stages, its tensor-parallel plan, its loss and the single-process reference;
- `parallel`: the same model pipelined (pipelib's executor on stages cut between decoder
  layers), ZeRO-sharded (stages 1-3, one unit per decoder layer) and tensor parallel (pipelib's
  column/row styles on q, k, v, o and the MLP's projections), each on the ranks of a group;
- `spawned`: those three on gloo ranks started by `torch.multiprocessing.spawn` (no launcher,
  no cluster), each compared with the single process;
- `tokenizer`: a byte-level BPE tokenizer trained locally with `tokenizers` on the book's
  corpus beside the character tokenizer: tokens per text and the embedding's share of the
  parameters.

Runtime layer (torch, transformers). Import each name from its module; importing the package
imports nothing.
"""
