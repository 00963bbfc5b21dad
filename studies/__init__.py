"""Research scripts: each answers one question about an engine, the instrument or the hardware
(see studies/README.md). They use the product's public API; the product never imports them."""
