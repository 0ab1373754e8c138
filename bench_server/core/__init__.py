"""Server configuration (`config`) and the bearer-token logic (`security`)."""
