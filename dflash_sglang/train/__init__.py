"""DFlash drafter training: self-distilled data from the target, block-diffusion loss, DDP-ready loop."""
