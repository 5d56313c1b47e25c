"""SGLang glue: the only part of dflash-sglang that imports sglang (core never does)."""
