"""The bundled smoke training: Beacon's first client. Copied into the image, never into a wheel."""
