module keelson.local/pause

go 1.26.0
