// ciuic/ciuic.h — the whole SDK in one include.
#pragma once
#include <ciuic/comm.h>
#include <ciuic/config.h>
#include <ciuic/context.h>
#include <ciuic/data.h>
#include <ciuic/error.h>
#include <ciuic/log.h>
#include <ciuic/metrics.h>
#include <ciuic/optimizer.h>
#include <ciuic/plugin.h>
#include <ciuic/precision.h>
#include <ciuic/sharding.h>
#include <ciuic/state.h>
#include <ciuic/store.h>
#include <ciuic/tokenizer.h>
#include <ciuic/version.h>
