"""dflash-sglang: DFlash block-diffusion speculative decoding as an SGLang plugin."""

__version__ = "0.1.0"
