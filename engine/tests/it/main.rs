mod catalog;
mod fuzz;
mod layers;
mod query;
mod store;
mod take;
