"""Programs as FX graphs: capture and export, shapes and sizes of dynamic programs, sites (the
subgraphs a pass rewrites) cut out on their own, and fingerprints."""
