"""fusedattn inside other libraries' dispatch points; nothing is registered on import.

* ``fusedattn.integrations.transformers.register()``: ``attn_implementation="fusedattn"`` in
  Hugging Face transformers.
* ``fusedattn.integrations.sdpa.register()`` / ``activated()``: ``torch.nn.functional.
  scaled_dot_product_attention``'s flash backend runs on fusedattn (torch's flash-attention
  provider mechanism, as FA3 and FA4 plug in).

See docs/integrations.md.
"""
