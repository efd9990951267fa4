config = _overlay_gemma4_mtp_compat(config)
